"""The model's output for a reasoning step, as the stability measure (stabray.stability) and the
Jacobian penalty of `jacreg` (stabray.methods.jacreg) both read it: the EXPECTED EMBEDDING
`softmax(logits) @ E` at a position (E = the input embedding matrix, taken as a constant: detached),
or the last hidden state where that position's state is fed back as a latent thought. Functions of
input embeddings, so that Jacobians with respect to the inputs are defined (docs/design.md,
"Stability measure")."""

from __future__ import annotations

import torch


def embedding_matrix(model) -> torch.Tensor:
    return model.get_input_embeddings().weight.detach()  # (V, d)


def _outputs(model, E, keep: int, hidden: torch.Tensor | None, **kw):
    """The last `keep` positions' outputs: expected embeddings, or the last hidden state where
    `hidden` (B, keep) is True (a position whose hidden state is fed back as a latent thought)."""
    if hidden is None:
        try:
            logits = model(logits_to_keep=keep, **kw).logits
        except TypeError:  # a model without logits_to_keep
            logits = model(**kw).logits[:, -keep:]
    else:
        res = model(logits_to_keep=keep, output_hidden_states=True, **kw)
        logits = res.logits
    probs = torch.softmax(logits[..., : E.shape[0]].float(), dim=-1)  # (B, keep, V)
    out = probs.to(E.dtype) @ E
    if hidden is not None:
        out = torch.where(hidden[..., None], res.hidden_states[-1][:, -keep:].to(E.dtype), out)
    return out


def expected_embedding_fn(model, keep: int, hidden: torch.Tensor | None = None, kv=None):
    """f(x): (B, L, d) input embeddings -> (B, keep, d) expected embeddings of the last `keep` positions
    (last hidden states where `hidden` is True). With `kv` (`prefix_kv`), x is the suffix after a
    constant prefix given as its per-layer keys/values: nothing flows back into the prefix, so
    forward, JVP and VJP cost scale with the suffix length, not the whole sequence."""
    E = embedding_matrix(model)

    def f(x):
        if kv is None:
            return _outputs(model, E, keep, hidden, inputs_embeds=x, use_cache=False)
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=list(kv))  # fresh: a forward appends to it
        return _outputs(model, E, keep, hidden, inputs_embeds=x, cache=cache, use_cache=True)

    return f


def prefix_kv(model, x_prefix: torch.Tensor):
    """Per-layer (key, value) tensors of a constant prefix, or None if the model has no KV cache."""
    try:
        res = model(inputs_embeds=x_prefix, use_cache=True, logits_to_keep=1)
    except TypeError:
        return None
    cache = getattr(res, "cache", None) or getattr(res, "past_key_values", None)
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(la, "keys", None) is None for la in layers):
        return None
    return [(la.keys, la.values) for la in layers]
