"""`hf-gate-attention serve`: transformers' OpenAI-compatible server (`transformers serve`) with this
package's loader plugged in, so that a gated checkpoint (ours, the paper's layout, a Hub id) is served with
its gates; other checkpoints load as `transformers serve` loads them. No server of our own: the endpoints,
continuous batching and streaming are transformers'. Needs the `[serving]` extra (docs/serving.md).
"""

from __future__ import annotations

from transformers import AutoProcessor, GenerationConfig
from transformers.cli.serve import Serve
from transformers.cli.serving.model_manager import ModelLoader
from transformers.cli.serving.utils import parse_model_id

from .core.hooks import CONFIG_ATTRIBUTE
from .sharing.layouts.paper import is_paper_config
from .sharing.loading import checkpoint_config, from_pretrained, load_processor


class GatedModelLoader(ModelLoader):
    """transformers serve's `ModelLoader`, loading gated checkpoints with `hf_gate_attention.from_pretrained`
    on the gate backend `backend`. Module level: the server's model processes get a pickled copy."""

    backend = "auto"

    def _gated_config(self, model_id: str):
        """The config of `model_id` if it is a gated checkpoint (ours or the paper's layout), else `None`."""
        repo, revision, gguf_file = parse_model_id(model_id)
        if gguf_file is not None:
            return None
        config = checkpoint_config(repo, revision=revision)
        gated = getattr(config, CONFIG_ATTRIBUTE, None) is not None or is_paper_config(config.to_dict())
        return config if gated else None

    def load_config(self, model_id: str):
        """`(config, generation config)` of `model_id`; a gated checkpoint's config names its base model."""
        config = self._gated_config(model_id)
        if config is None:
            return super().load_config(model_id)
        repo, revision, _ = parse_model_id(model_id)
        try:  # as transformers serve does: the repo's generation config if it has one
            generation_config = GenerationConfig.from_pretrained(repo, revision=revision)
        except OSError:
            generation_config = GenerationConfig.from_model_config(config)
        return config, generation_config

    def load_processor(self, model_id: str):
        """The processor (or tokenizer) of `model_id`; a gated checkpoint's without a remote-code question."""
        if self._gated_config(model_id) is None:
            return super().load_processor(model_id)
        repo, revision, _ = parse_model_id(model_id)
        return load_processor(repo, AutoProcessor, revision=revision)

    def _load_model(self, model_id: str, tqdm_class: type | None = None, progress_callback=None):
        if self._gated_config(model_id) is None:
            return super()._load_model(model_id, tqdm_class=tqdm_class, progress_callback=progress_callback)
        repo, revision, _ = parse_model_id(model_id)
        kwargs = {
            "revision": revision,
            "attn_implementation": self.attn_implementation,
            "dtype": self.dtype,
            "device_map": self.device,
        }
        quantization_config = self.get_quantization_config()
        if quantization_config is not None:
            kwargs["quantization_config"] = quantization_config
        if tqdm_class is not None:
            kwargs["tqdm_class"] = tqdm_class
        return from_pretrained(repo, backend=self.backend, **kwargs)


class GatedServe(Serve):
    """`transformers serve` whose loader is `GatedModelLoader` (set before the server starts, with the
    gate backend `backend`). Arguments: `transformers.cli.serve.Serve`'s, plus `backend`."""

    def __init__(self, *args, backend: str = "auto", **kwargs):
        self.gate_backend = backend
        super().__init__(*args, **kwargs)

    def _use_gated_loader(self) -> None:
        if not isinstance(self.loader, GatedModelLoader):
            loader = GatedModelLoader.__new__(GatedModelLoader)
            loader.__dict__.update(self.loader.__dict__)  # the settings transformers resolved
            loader.backend = self.gate_backend
            self.loader = loader

    def run(self, *args, **kwargs) -> None:
        self._use_gated_loader()
        super().run(*args, **kwargs)

    def run_api_servers(self, count: int) -> None:
        self._use_gated_loader()
        super().run_api_servers(count)
