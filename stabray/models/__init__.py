from stabray.models.build import LoraSpec, ModelSpec, build_model, load_tokenizer

__all__ = ["ModelSpec", "LoraSpec", "build_model", "load_tokenizer"]
