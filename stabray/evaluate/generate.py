"""Greedy decoding to EOS, batched with left padding; a method's decoding at each input's own
evaluation stride (`generate_per_input`)."""

from __future__ import annotations

import torch

from stabray.data.encode import Encoder, left_pad


@torch.no_grad()
def greedy(
    model,
    encoder: Encoder,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """Generated token ids after each prompt, EOS and anything after it removed."""
    was_training = model.training
    model.eval()
    out: list[list[int]] = []
    for b in range(0, len(prompts), batch_size):
        chunk = [encoder.prompt(p) for p in prompts[b : b + batch_size]]
        batch = {k: v.to(device) for k, v in left_pad(chunk, encoder.pad).items()}
        gen = model.generate(
            **batch, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=encoder.eos, pad_token_id=encoder.pad
        )
        for row in gen[:, batch["input_ids"].shape[1] :].tolist():
            out.append(row[: row.index(encoder.eos)] if encoder.eos in row else row)
    model.train(was_training)
    return out


def generate_per_input(
    method,
    model,
    encoder: Encoder,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    prompt_lens: list[int] | None = None,
) -> list[list[int]]:
    """`method.generate` on the prompts, each at the evaluation stride the model picks for it (a
    model with `model.position_eval_stride` a list: stabray.models.positions.by_input_stride; any
    other model: one call). `prompt_lens`: the prompts' encoded lengths, when the caller has them."""
    from stabray.models.positions import by_input_stride

    return by_input_stride(
        model,
        prompt_lens if prompt_lens is not None else [len(encoder.prompt(p)) for p in prompts],
        lambda idx: method.generate(
            model, encoder, [prompts[i] for i in idx], max_new_tokens, batch_size=batch_size, device=device
        ),
    )
