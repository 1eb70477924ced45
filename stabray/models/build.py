"""Models: the embedded default (a small Qwen2-style decoder built from a transformers config and
trained from scratch) or a pretrained Hugging Face causal LM (a hub name or a local directory) with
optional peft LoRA.

The dataset tells the embedded model its vocabulary (the tokenizer built from the task's text) and
its context length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from stabray.config import embedded_shape


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 16  # LoRA rank r
    alpha: int = 32  # scaling numerator (the update is scaled by alpha / rank)
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class ModelSpec:
    pretrained: str | None = None  # hub name or local directory; None = the embedded decoder
    lora: LoraSpec | None = None  # LoRA adapters on a pretrained model (None = full fine-tuning)
    preset: str = "small"  # embedded shape (stabray.config.PRESETS), overridden field by field below
    hidden_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    intermediate_size: int | None = None
    max_positions: int = 2048  # context length of the embedded decoder
    family: str = "qwen2"  # embedded architecture: qwen2 (RoPE) | gpt2 (learned absolute positions) | bloom (ALiBi)
    positions: str = "default"  # "none": no positional encoding (NoPE; gpt2 only: its position table zeroed, frozen)
    # "random" (qwen2 only): training positions are a sorted random subset of 0..position_span-1
    # drawn per step, evaluation's are 0, 1, 2, ... (stabray.models.positions)
    position_span: int | None = None  # None: max_positions
    # "random": evaluation positions 0, k, 2k, ...; None: 1; several: per input (stabray.models.positions)
    position_eval_stride: int | tuple[int, ...] | None = None
    position_span_min: int | None = None  # "random": each step's span drawn from max(length, this)..span
    init_std: float | None = None  # embedded: initializer_range of the transformers config (None: its 0.02)
    freeze_embeddings: bool = False  # embedded: the token embeddings (tied with the head) keep their random init
    extra: dict[str, Any] = field(default_factory=dict)  # more transformers config fields

    @property
    def label(self) -> str:
        if self.pretrained:
            return self.pretrained + (f"+lora{self.lora.rank}" if self.lora else "")
        s = self.shape()
        return f"embedded-{s['hidden_size']}x{s['num_layers']}"

    def shape(self) -> dict[str, int]:
        return embedded_shape(self.preset, vars(self))


def load_tokenizer(spec: ModelSpec):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec.pretrained)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def build_model(spec: ModelSpec, tokenizer, seed: int = 0) -> torch.nn.Module:
    """A causal LM ready to train. Eager attention: the stability measure differentiates through
    the model with torch.func, and eager attention supports forward-mode AD everywhere."""
    from stabray.errors import UserError

    torch.manual_seed(seed)
    if spec.pretrained is None:
        from stabray.config import position_options_problem

        problem = position_options_problem(spec, prefix="model.")
        if problem:
            raise UserError(problem)
        model = _build_embedded(spec, tokenizer)
        if spec.positions == "random":
            from stabray.models.positions import wrap_random_positions

            span = spec.position_span or spec.max_positions
            wrap_random_positions(model, span, spec.position_eval_stride or 1, spec.position_span_min)
        if spec.freeze_embeddings:  # a token never trained on keeps a vector like every other token's
            model.get_input_embeddings().weight.requires_grad_(False)
        return model
    from stabray.config import pretrained_problem

    problem = pretrained_problem(spec, prefix="model.")
    position_options = (spec.position_span, spec.position_eval_stride, spec.position_span_min)
    if problem is None and any(v is not None for v in position_options):
        problem = "model.position_span, position_eval_stride and position_span_min apply to the embedded decoder only"
    if problem:
        raise UserError(problem)
    return _build_pretrained(spec, tokenizer)


def _build_embedded(spec: ModelSpec, tokenizer) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = spec.shape()
    common = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",
        tie_word_embeddings=True,
        **({"initializer_range": spec.init_std} if spec.init_std is not None else {}),
        **spec.extra,
    )
    if spec.family == "bloom":
        # ALiBi (Press et al. 2022): no position embeddings, a fixed per-head linear bias on the
        # attention scores. Bloom's MLP width is 4 x hidden (intermediate_size is not used).
        from transformers import BloomConfig, BloomForCausalLM

        cfg = BloomConfig(
            hidden_size=s["hidden_size"],
            n_layer=s["num_layers"],
            n_head=s["num_heads"],
            hidden_dropout=0.0,
            attention_dropout=0.0,
            **common,
        )
        return BloomForCausalLM(cfg)
    if spec.family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            n_embd=s["hidden_size"],
            n_layer=s["num_layers"],
            n_head=s["num_heads"],
            n_inner=s["intermediate_size"],
            n_positions=spec.max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
        model = GPT2LMHeadModel(cfg)
        if spec.positions == "none":  # NoPE (Kazemnejad et al. 2023): causal attention alone orders tokens
            model.transformer.wpe.weight.data.zero_()
            model.transformer.wpe.weight.requires_grad_(False)
        return model
    cfg = Qwen2Config(
        hidden_size=s["hidden_size"],
        num_hidden_layers=s["num_layers"],
        num_attention_heads=s["num_heads"],
        num_key_value_heads=s["num_heads"],
        intermediate_size=s["intermediate_size"],
        max_position_embeddings=spec.max_positions,
        **common,
    )
    return Qwen2ForCausalLM(cfg)


def _build_pretrained(spec: ModelSpec, tokenizer) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec.pretrained, attn_implementation="eager", **spec.extra)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    if spec.lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=spec.lora.rank,
                lora_alpha=spec.lora.alpha,
                lora_dropout=spec.lora.dropout,
                target_modules=list(spec.lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )
    return model
