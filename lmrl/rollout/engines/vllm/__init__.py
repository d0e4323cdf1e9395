"""The vLLM engine (``engine=vllm``): `engine.VLLMEngine` samples with the training model's weights, pushed in place.

Where vLLM runs is its driver's business: `driver.VLLMDriver` in this process (colocated), or `lmrl vllm-serve`
(`server`) behind `client.RemoteVLLM` (one server) or `replicas.Replicas` (several); `weights` names the tensors a
push sends, `group` sends them over a process group (vllm_weight_transport=gloo|nccl), `wire` is what the server and
its client agree on. Imports nothing on its own: `EngineSection` and `lmrl vllm-serve`'s config load without torch.
"""
