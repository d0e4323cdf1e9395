"""Reuse the sampler's linear-layer outputs in the training forward (on-policy, before any weight update).

Sampling a completion runs the policy forward on every token: prefill on the B distinct prompts, then one token
per step. An on-policy update runs the same forward again, with autograd, on the same tokens and the same weights,
only batched. ``LinearRecorder`` keeps the output of every ``nn.Linear`` (and GPT-2's ``Conv1D``) during sampling;
``replaying`` makes the training forward return those outputs instead of multiplying again. Everything else
(embeddings, norms, RoPE, attention, activations) is recomputed, so autograd has its graph, and the backward is the
usual one:

    y = x W^T + b  (the recorded y),   dL/dx = g W,   dL/dW = g^T x,   dL/db = sum g

with x the training forward's own input to the layer. The matmuls of the forward (a third of the training
FLOPs) are skipped; values and gradients equal the recomputed ones up to rounding (the sampler attends over its
KV cache, the learner over the full sequence).

A recorded output is used only when it is certainly the same computation; otherwise the layer computes as usual:
every parameter's in-place version (bumped by every optimizer step) must be the one seen while sampling, the input
shape must be the recorded one (prompt forward (U, P), completion forward (N, T-1), as in
``shared_prompt_outputs``), the dtype the one the layer would produce, and each layer must have run once per
forward. Models whose forward would drop anything in their current modes (a policy in training mode with
dropout) are not recorded: sampling runs in eval mode, so the learner's outputs would differ.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref

import torch
import torch.nn.functional as F

from lmrl.models import rebuild, usage
from lmrl.models.hf_compat import cache_kwarg

__all__ = ["LinearOutputs", "LinearRecorder", "has_dropout", "replaying"]


def is_linear(module) -> bool:
    """An affine layer y = x W^T + b: ``nn.Linear`` (and subclasses), or transformers' ``Conv1D`` (GPT-2's layers,
    y = x W + b with W stored (in, out))."""
    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


def linear_weight(module) -> torch.Tensor:
    """W as ``F.linear`` takes it, (out, in): a Conv1D's weight transposed (a view: gradients reach the parameter)."""
    return module.weight if isinstance(module, torch.nn.Linear) else module.weight.t()


def parameter_versions(model) -> dict[str, int]:
    """Each parameter's in-place version counter (an optimizer step bumps every updated parameter's)."""
    return {name: p._version for name, p in model.named_parameters()}


def has_dropout(model) -> bool:
    """Whether a forward of ``model`` in its current modes drops anything: a module in training mode that is an
    nn.Dropout with p > 0, or has an attribute named *dropout* > 0 (HF attention passes ``attention_dropout`` to its
    kernel in training mode). An RL policy in eval mode (GPT-2's 0.1 dropouts included) drops nothing."""
    for module in model.modules():
        if not module.training:
            continue
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            return True
        if any("dropout" in key and isinstance(v, float) and v > 0 for key, v in vars(module).items()):
            return True
    return False


@dataclasses.dataclass(frozen=True, eq=False)
class LinearOutputs:
    """The outputs of every nn.Linear of one rollout, by module name, and the rows a batch selects from them.

    prefill[name]: (B, P', out) from the prompt forward (P' = P, or 1 for a layer HF applies to the last position
    only, like the LM head). decode[name]: (N, T-1, out) for T sampled steps (a view of a step-major buffer);
    position j holds the output for completion token j as input (the last token is never an input).
    versions: every parameter's ``_version`` while sampling. rows: (n,) the original row of each row of the batch
    that holds this record (prompt-major: original row r belongs to prompt r // group_size). last_use: the forward
    that replays this record is its last one, so `replaying` frees each layer's record once used (every sub-batch
    shares the dicts): it is not held through the backward, where the step's memory peaks.
    """

    prefill: dict[str, torch.Tensor]
    decode: dict[str, torch.Tensor]
    versions: dict[str, int]
    group_size: int
    rows: torch.Tensor
    last_use: bool = False

    def select(self, indices: torch.Tensor) -> LinearOutputs:
        """The record for the sub-batch of rows `indices` (positions in the current batch)."""
        return dataclasses.replace(self, rows=self.rows[indices.to(self.rows.device)])

    def for_last_use(self) -> LinearOutputs:
        """This record, freed layer by layer by the forward that replays it (see ``last_use``)."""
        return dataclasses.replace(self, last_use=True)


MAX_RECORDED_VOCAB = 4096
"""The LM head is recorded only up to this vocabulary size: beyond it the record would be every step's logits
(128 rows x 256 steps x Qwen2.5's 151,936 entries in bf16: 10 GB), and the training forward computes the head in
chunks (`lmrl.models.head`) anyway."""


class SamplingRecorder:
    """What a `ForwardPlan` with the replay trick hands the sampler: ``start`` gives one rollout its `LinearRecorder`,
    or None where nothing would replay it (a model with dropout: its training forward is not the sampler's; a model
    whose forward takes no KV cache: the shared-prompt forward that replays is off)."""

    def start(self, model, rows: int, steps: int) -> LinearRecorder | None:
        if has_dropout(model) or cache_kwarg(model) is None:
            return None
        return LinearRecorder(model, rows=rows, steps=steps)


class LinearRecorder:
    """Records every nn.Linear output of `model` during one rollout.

        recorder = LinearRecorder(model, rows=N, steps=max_new_tokens)
        with recorder.prefill(): model(prompts)            # (B, P) distinct prompts
        with recorder.decode(step, rows): model(tokens)    # (active, 1): completion token `step` of `rows`
        recorder.drop(rows, step)                          # rows leave the batch before `step`'s forward
        outputs = recorder.finish(steps_run, group_size)   # LinearOutputs, or None if a layer ran twice

    rows=None in `decode` means all N rows in order. Decode outputs are copied into step-major (steps - 1, N, out)
    buffers (one contiguous copy per layer and step; row-major strided writes measured ~20 ms slower per rollout);
    `finish` hands out (N, T-1, out) views of them. The buffers are new for every rollout: the last training forward
    that replays them frees them (`LinearOutputs.last_use`), so they are not held from one step to the next (a pool
    that kept them saved ~10 ms per rollout on builtin:medium and held 705 MiB through SmolLM2-135M's backward).
    Hooks are removed by `finish` (or `close`).
    """

    def __init__(self, model, rows: int, steps: int):
        self.n_rows, self.steps = rows, steps
        self.names = {m: name for name, m in model.named_modules() if is_linear(m)}
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if isinstance(head, torch.nn.Linear) and head.out_features > MAX_RECORDED_VOCAB:
            self.names.pop(head, None)  # its record would be the logits of every step: the layer is recomputed
        self.versions = parameter_versions(model)
        self.prefill_out: dict[str, torch.Tensor] = {}
        self.decode_out: dict[str, torch.Tensor] = {}
        self._where: tuple[str, int, torch.Tensor | None] | None = None  # (phase, step, rows) of the current call
        self._seen: set[str] = set()
        self.unrecorded: set[str] = set()  # layers whose outputs are not (rows, tokens, out)
        self.valid = True
        self._handles = [m.register_forward_hook(self._hook) for m in self.names]

    @contextlib.contextmanager
    def prefill(self):
        with self._phase(("prefill", 0, None)):
            yield

    @contextlib.contextmanager
    def decode(self, step: int, rows: torch.Tensor | None):
        with self._phase(("decode", step, rows)):
            yield

    @contextlib.contextmanager
    def _phase(self, where):
        self._where, self._seen = where, set()
        try:
            yield
        finally:
            self._where = None

    def _hook(self, module, inputs, output) -> None:
        if self._where is None or not isinstance(output, torch.Tensor):
            return
        name = self.names[module]
        if name in self._seen:  # a layer used twice per forward: the record cannot say which call is which
            self.valid = False
        self._seen.add(name)
        phase, step, rows = self._where
        if name in self.unrecorded:
            return
        if output.dim() != 3 or (phase == "decode" and output.shape[1] != 1):  # e.g. OPT's MLP on (rows x tokens, H)
            self.unrecorded.add(name)  # not (rows, tokens, out): this layer is computed in training, the others replay
            self.prefill_out.pop(name, None)
            self.decode_out.pop(name, None)
            return
        if phase == "prefill":
            self.prefill_out[name] = output.detach().clone()  # a copy: the model may modify its output in place
            return
        buf = self.decode_out.get(name)
        if buf is None:  # (steps - 1, N, out): the last token is never an input; `drop` zeroes unreached positions
            buf = self.decode_out[name] = output.new_empty((self.steps - 1, self.n_rows, output.shape[-1]))
        if rows is None:
            buf[step] = output[:, 0]  # step-major: one contiguous copy per layer and step
        else:
            buf[step, rows] = output[:, 0]

    def drop(self, rows: torch.Tensor, step: int) -> None:
        """`rows` (original indices) leave the batch before the forward of `step`: zero their positions from
        `step` on (finite values for padding that the learner masks)."""
        for buf in self.decode_out.values():
            buf[step:, rows] = 0

    def finish(self, steps: int, group_size: int) -> LinearOutputs | None:
        self.close()
        if not self.valid or not self.prefill_out:
            return None
        return LinearOutputs(
            self.prefill_out,
            {k: v[: steps - 1].transpose(0, 1) for k, v in self.decode_out.items()},
            self.versions,
            group_size,
            torch.arange(self.n_rows),
        )

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


DENSE_SHARE = 0.9
"""A backward multiplies every row when at least this share of its rows carries a gradient: the gather of g and x
and the scatter of dL/dx cost ~3 ms against ~80 ms for the two matmuls at SmolLM2's (2016, 1536) x (1536, 576),
so skipping under 10% of the rows would spare little more than they cost."""


def rows_with_gradient(flat_grad: torch.Tensor) -> torch.Tensor | None:
    """The rows (M,) of a layer's output gradient (M, out) that are not all exactly 0, or None when they are
    nearly all of them (``DENSE_SHARE``). Exact by construction: an all-zero row of g adds nothing to
    dL/dW = g^T x and gives a zero row of dL/dx = g W. In a right-padded batch every position after a row's last
    trained token has such a row (the loss never reads it, and causal attention sends no gradient back to it):
    50-59% of the completion forward's rows on SmolLM2 at 8 x 4 x 64. |g| max != 0 keeps NaN rows."""
    nonzero = flat_grad.abs().amax(dim=1) != 0  # (M,) one read of g: cheaper than ne(0).any(1)
    kept = int(nonzero.sum())
    if kept >= DENSE_SHARE * len(nonzero):
        return None
    return nonzero.nonzero().squeeze(1)


class _ReplayedLinear(torch.autograd.Function):
    """y = the recorded x W^T + b (a contiguous copy of the record, which may be a strided view: models such as
    Falcon modify a layer's output in place, which must change neither the record nor an alias autograd forbids);
    backward as F.linear's under autocast, on ``x_low``, x in the compute dtype: g W_low, g^T x_low, sum g, with
    W_low the weight cast to the compute dtype when the backward reads it (kept as the parameter itself, which the
    model holds anyway, instead of a cast of every layer's weight: 202 MiB on SmolLM2-135M). The weight and bias
    gradients come back in their own dtype, as autocast's cast would return them; dL/dx in x's own dtype, so layers
    that read one x and share one ``x_low`` (q, k, v) add their gradients in x's precision. The backward multiplies
    only the rows of g that are not all 0 (`rows_with_gradient`: the padding after each completion)."""

    @staticmethod
    def forward(ctx, x, weight, bias, recorded, x_low):
        ctx.save_for_backward(x_low, weight)
        ctx.x_dtype = x.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return recorded.clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        flat_grad = grad.reshape(-1, grad.shape[-1])  # (M, out)
        flat_x = x.reshape(-1, x.shape[-1])  # (M, in)
        total = len(flat_x)
        rows = rows_with_gradient(flat_grad)
        if rows is not None:  # (K,) rows of M: the others add nothing
            flat_grad, flat_x = flat_grad.index_select(0, rows), flat_x.index_select(0, rows)
        usage.count("backward_rows", len(flat_x))  # the skipping is counted, never assumed
        usage.count("backward_rows_skipped", total - len(flat_x))
        grad_x = None
        if ctx.needs_input_grad[0]:
            part = (flat_grad @ weight.to(grad.dtype)).to(ctx.x_dtype)  # (K, in)
            if rows is not None:
                part = part.new_zeros(total, part.shape[-1]).index_copy_(0, rows, part)
            grad_x = part.view(*grad.shape[:-1], part.shape[-1])
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (flat_grad.t() @ flat_x).to(weight.dtype)
        grad_b = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = flat_grad.sum(0).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None


def _index_or_none(index: torch.Tensor) -> torch.Tensor | None:
    """None when `index` is 0, 1, ..., n-1 (taking it is the identity: no copy), else the index itself."""
    return None if torch.equal(index, torch.arange(len(index), device=index.device)) else index


@contextlib.contextmanager
def replaying(model, outputs: LinearOutputs | None, prompt_rows: torch.Tensor | None = None):
    """Within the block, each nn.Linear of `model` returns its recorded output when it is the same computation.

    Call k of a layer inside the block: k = 0 is the prompt forward of the distinct prompts whose first rows (in
    the current batch) are `prompt_rows` (U,); k = 1 is the completion forward of all rows. A layer whose call
    does not match its record (shape, dtype, weight version) computes F.linear as usual. Layers that read the same
    input one after the other (q, k and v; gate and up) share one cast of it to the compute dtype, kept for the
    backward once instead of once per layer (autocast casts a non-leaf input for every layer; the gradients are
    the same: `_ReplayedLinear`). With ``outputs.last_use`` each call drops its record from ``outputs`` once done.
    Yields a dict counting replayed and computed calls.
    """
    counts = {"replayed": 0, "computed": 0}
    if outputs is None or parameter_versions(model) != outputs.versions:  # any changed weight changes every layer after
        yield counts
        return
    # layers whose forward someone else already replaced on the instance (e.g. accelerate hooks) are left alone
    modules = [(name, m) for name, m in model.named_modules() if is_linear(m) and "forward" not in vars(m)]
    rows = _index_or_none(outputs.rows)
    prompts = None if prompt_rows is None else outputs.rows[prompt_rows.to(outputs.rows.device)] // outputs.group_size
    prompt_index = None if prompts is None else _index_or_none(prompts)
    last_input: list = [None, -1, None]  # (weakref to the last input, its version, its cast)

    def input_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """x in ``dtype`` (outside autograd: `_ReplayedLinear` returns x's gradient itself), the same tensor for
        consecutive layers that read the same, unmodified ``x``."""
        ref, version, cast = last_input
        if ref is not None and ref() is x and version == x._version and cast.dtype == dtype:
            return cast
        with torch.no_grad():
            cast = x.to(dtype)
        if cast is not x:  # saved as x when the backward keeps x anyway (`lmrl.models.rebuild`)
            rebuild.rebuildable(cast, functools.partial(torch.Tensor.to, dtype=dtype), x, name="input_cast")
        last_input[:] = [weakref.ref(x), x._version, cast]
        return cast

    def release(name: str, call: int) -> None:
        if outputs.last_use:
            (outputs.prefill if call == 0 else outputs.decode).pop(name, None)

    def recorded_output(name, module, x, call) -> torch.Tensor | None:
        if call == 0 and prompts is not None and name in outputs.prefill:
            out = outputs.prefill[name]
            if x.shape[:-1] != (len(prompts), out.shape[1]):
                return None
            if prompt_index is not None or len(out) != len(prompts):
                out = out[prompts.to(out.device)]
        elif call == 1 and name in outputs.decode:
            out = outputs.decode[name]
            if x.dim() != 3 or x.shape[0] != len(outputs.rows) or x.shape[1] > out.shape[1]:
                return None
            if rows is not None or len(out) != len(outputs.rows):
                out = out[outputs.rows.to(out.device)]
            out = out[:, : x.shape[1]]  # the record is step-major: a strided view, copied once by _ReplayedLinear
        else:
            return None
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        return out if out.dtype == dtype else None

    def make_forward(name, module):
        calls = [0]

        def forward(x):
            call, calls[0] = calls[0], calls[0] + 1
            out = recorded_output(name, module, x, call)
            if out is None:
                counts["computed"] += 1
                release(name, call)
                return F.linear(x, linear_weight(module), module.bias)
            counts["replayed"] += 1
            y = _ReplayedLinear.apply(x, linear_weight(module), module.bias, out, input_cast(x, out.dtype))
            release(name, call)
            return y

        return forward

    for name, module in modules:
        module.forward = make_forward(name, module)
    try:
        yield counts
    finally:
        for _, module in modules:
            del module.forward  # back to the class's forward
