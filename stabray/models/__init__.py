from stabray.models.build import ModelSpec, LoraSpec, build_model, load_tokenizer

__all__ = ["ModelSpec", "LoraSpec", "build_model", "load_tokenizer"]
