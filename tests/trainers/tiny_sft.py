"""The smallest SFT run the run-directory tests start (one layer of 32, 1-digit arithmetic, fp32, no evaluation)."""

TINY = [
    "model_args.hidden_size=32",
    "model_args.num_hidden_layers=1",
    "model_args.intermediate_size=64",
    "model_args.num_attention_heads=2",
    "precision=fp32",
    "task_args.digits=1",
    "train_rows=32",
    "eval_rows=4",
    "batch_size=4",
    "eval_every=0",
    "warmup_steps=0",
    "lr_schedule=constant",
    "log_every=1",
    "check_contamination=false",
]
