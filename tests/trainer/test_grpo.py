"""GRPO: the loss against an independent loop implementation, advantages, logprobs, and the trainer on a tiny model.

No downloads: the trainer tests use a tiny randomly initialised Llama; the save test copies the default model's
tokenizer files when that model is available offline (and checks the weights alone otherwise).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainer.config import TrainerSettings  # noqa: E402
from trainer.grpo import grpo_config  # noqa: E402
from trainer.grpo_loss import (  # noqa: E402
    GRPOConfig,
    GRPOSample,
    group_advantages,
    grpo_loss,
    pad_right,
    sequence_logprobs,
)
from trainer.grpo_trainer import GRPOTrainer  # noqa: E402

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------- reference


def reference_loss(logp_new, beh, prox, adv, lengths, off, cfg, ref=None):
    """The documented objective, one token at a time, with explicit branches instead of min/clamp."""
    z = sum(lengths) if cfg.advantage == "grpo" else len(lengths) * cfg.max_tokens
    total = torch.zeros((), dtype=logp_new.dtype)
    for i in range(len(lengths)):
        a = float(adv[i])
        for t in range(lengths[i]):
            ratio = torch.exp(logp_new[i, t] - float(prox[i, t]))
            r = float(ratio.detach())
            if a > 0 and r > 1 + cfg.clip_high:
                surrogate = torch.tensor((1 + cfg.clip_high) * a, dtype=logp_new.dtype)
            elif a < 0 and r < 1 - cfg.clip_low:
                surrogate = torch.tensor((1 - cfg.clip_low) * a, dtype=logp_new.dtype)
            else:
                surrogate = ratio * a
            weight = 1.0
            if off[i] or cfg.is_on_policy:
                weight = min(math.exp(float(prox[i, t]) - float(beh[i, t])), cfg.is_cap)
            term = -weight * surrogate
            if ref is not None:
                d = float(ref[i, t]) - logp_new[i, t]
                term = term + cfg.kl_coef * (torch.exp(d) - d - 1)
            total = total + term
    return total / z


def random_batch(seed=0, rows=6, width=9):
    """Logprob tensors [rows, width] (float64) where both clip bounds bind and some IS weights exceed the cap."""
    g = torch.Generator().manual_seed(seed)
    lengths = [9, 4, 7, 1, 6, 8][:rows]
    prox = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3 - 0.05
    new = prox + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.4  # ratios ~ e^{+-0.8}
    beh = prox + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.8  # weights up to > 2
    ref = prox + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3
    adv = torch.tensor([1.3, -0.7, 0.4, -1.1, 0.9, -0.2], dtype=torch.float64)[:rows]
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    for t in (new, beh, ref, prox):  # padding is garbage: the mask must keep it out
        t[~mask] = 50.0
    off = torch.tensor([False, True, True, False, True, True][:rows])
    return new, beh, prox, ref, adv, mask, lengths, off


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo"])
@pytest.mark.parametrize("kl", [0.0, 0.07])
@pytest.mark.parametrize("is_on_policy", [False, True])
def test_loss_and_gradients_match_the_reference(advantage, kl, is_on_policy):
    cfg = GRPOConfig(
        group_size=4, advantage=advantage, kl_coef=kl, clip_low=0.2, clip_high=0.28, is_cap=2.0, max_tokens=16
    )
    cfg.is_on_policy = is_on_policy
    new, beh, prox, ref, adv, mask, lengths, off = random_batch()

    x = new.clone().requires_grad_(True)
    loss, stats = grpo_loss(x, beh, adv, mask, cfg, ref_logp=ref if kl else None, logp_prox=prox, off_policy=off)
    loss.backward()

    y = new.clone().requires_grad_(True)
    expected = reference_loss(y, beh, prox, adv, lengths, off.tolist(), cfg, ref=ref if kl else None)
    expected.backward()

    assert stats["clip_low_tokens"] > 0 and stats["clip_high_tokens"] > 0  # both bounds bind somewhere
    assert stats["is_truncated_tokens"] > 0  # some off-policy weights are truncated at the cap
    assert stats["tokens"] == sum(lengths)
    assert torch.allclose(loss, expected, rtol=1e-12, atol=1e-12), (float(loss), float(expected))
    assert torch.allclose(x.grad, y.grad, rtol=1e-10, atol=1e-12)
    assert not x.grad[~mask].any()  # padding gets no gradient
    # clipped tokens get no gradient from the policy term
    ratio = torch.exp(new - prox)
    a = adv[:, None].expand_as(new)
    bound = mask & (((a > 0) & (ratio > 1 + cfg.clip_high)) | ((a < 0) & (ratio < 1 - cfg.clip_low)))
    if not kl:
        assert bound.any() and not x.grad[bound].any()


def test_micro_batches_add_up_to_the_full_batch():
    cfg = GRPOConfig(group_size=4, kl_coef=0.05)
    new, beh, prox, ref, adv, mask, lengths, off = random_batch(seed=3)
    z = float(sum(lengths))
    x = new.clone().requires_grad_(True)
    full, _ = grpo_loss(x, beh, adv, mask, cfg, ref_logp=ref, logp_prox=prox, off_policy=off)
    full.backward()
    y = new.clone().requires_grad_(True)
    parts = []
    for rows in (slice(0, 2), slice(2, 6)):
        part, _ = grpo_loss(
            y[rows], beh[rows], adv[rows], mask[rows], cfg, ref[rows], prox[rows], off[rows], normalizer=z
        )
        part.backward()
        parts.append(part)
    assert torch.allclose(full, sum(parts), atol=1e-12)
    assert torch.allclose(x.grad, y.grad, atol=1e-12)


def test_on_policy_first_step_is_the_plain_policy_gradient():
    """Without logp_prox (the current weights) the ratio is 1: gradient = A / Z on every real token."""
    cfg = GRPOConfig(group_size=4)
    new, beh, _, _, adv, mask, lengths, _ = random_batch(seed=5)
    x = new.clone().requires_grad_(True)
    loss, stats = grpo_loss(x, beh, adv, mask, cfg)
    loss.backward()
    expected = torch.where(mask, -adv[:, None].expand_as(new) / sum(lengths), torch.zeros_like(new))
    assert torch.allclose(x.grad, expected, atol=1e-12)
    assert stats["clip_low_tokens"] == stats["clip_high_tokens"] == 0


# ---------------------------------------------------------------------------------------------- advantages


def test_group_advantages():
    adv, skipped = group_advantages([1.0, 1.0, 1.0, 1.0], "grpo")
    assert skipped and not adv.any()
    _, skipped = group_advantages([0.0, 0.0], "dr_grpo")
    assert skipped

    rewards = [0.0, 1.0, 0.0, 0.5]
    mean = sum(rewards) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 3)  # unbiased
    adv, skipped = group_advantages(rewards, "grpo", eps=1e-4)
    assert not skipped
    assert torch.allclose(adv, torch.tensor([(r - mean) / (std + 1e-4) for r in rewards]), atol=1e-6)
    adv, skipped = group_advantages(rewards, "dr_grpo")
    assert not skipped
    assert torch.allclose(adv, torch.tensor([r - mean for r in rewards]), atol=1e-7)
    with pytest.raises(ValueError):
        group_advantages(rewards, "ppo")


# ---------------------------------------------------------------------------------------------- the tiny model


def tiny_llama(vocab=128, hidden=32, seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_llama().save_pretrained(path)
    return path


def test_sequence_logprobs_match_unpadded_forward():
    model = tiny_llama()
    prompts = [[5, 6, 7], [9], [3, 4, 5, 6, 7, 8], [10, 11]]
    completions = [[20, 21, 22, 23], [30, 31], [40], []]
    got = sequence_logprobs(model, prompts, completions)
    assert [len(g) for g in got] == [4, 2, 1, 0]
    with torch.no_grad():
        for p, c, g in zip(prompts, completions, got, strict=True):
            if not c:
                continue
            logits = model(torch.tensor([p + c])).logits[0].float()
            want = torch.log_softmax(logits, -1)[len(p) - 1 : len(p) + len(c) - 1].gather(-1, torch.tensor(c)[:, None])
            assert torch.allclose(g.detach(), want[:, 0], atol=1e-5), (g, want)
    assert got[0].requires_grad  # a training forward: the gradient flows


def behaviour(model_path, prompt, completions):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_path)).eval()
    with torch.no_grad():
        return [lp.tolist() for lp in sequence_logprobs(model, [prompt] * len(completions), completions)]


def make_group(model_path, prompt, completions, rewards, version=0):
    lps = behaviour(model_path, prompt, completions)
    return [GRPOSample(prompt, c, lp, r, version) for c, lp, r in zip(completions, lps, rewards, strict=True)]


def test_step_raises_the_logprob_of_the_rewarded_completion(tiny_path, tmp_path):
    cfg = GRPOConfig(group_size=4, lr=3e-3, grad_accum=2)
    trainer = GRPOTrainer(tiny_path, cfg, tmp_path)
    prompt = [5, 6, 7]
    completions = [[20, 21, 22, 2], [30, 31, 32, 2], [40, 41, 2], [50, 51, 52, 53]]
    group = make_group(tiny_path, prompt, completions, [1.0, 0.0, 0.0, 0.0])
    flat = make_group(tiny_path, [8, 9], [[3, 4], [4, 3]], [0.5, 0.5])  # no signal: skipped
    with torch.no_grad():
        before = [float(s.sum()) for s in sequence_logprobs(trainer.model, [prompt] * 4, completions)]
    m = trainer.step([group, flat])
    with torch.no_grad():
        after = [float(s.sum()) for s in sequence_logprobs(trainer.model, [prompt] * 4, completions)]
    assert m["updated"] and m["skipped_groups"] == 1 and m["sequences"] == 4 and m["tokens"] == 15
    assert trainer.version == 1 and trainer.skipped_groups == 1
    assert after[0] > before[0] + 0.05, (before, after)  # the rewarded completion became likelier
    assert all(a < b for a, b in zip(after[1:], before[1:], strict=True)), (before, after)

    # a batch of nothing but all-equal groups changes nothing
    state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    m = trainer.step([flat])
    assert not m["updated"] and trainer.version == 1
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in state.items())


def test_extra_epochs_reuse_the_batch_and_the_clip_bounds_bind(tiny_path, tmp_path):
    """With `grpo_epochs` > 1 the later optimizer steps of a batch see ratios to the step's starting weights far
    from 1: the clipped-token fractions the step reports are the ones counted here, token by token with unpadded
    forwards, from the weights each optimizer step started from."""
    settings = TrainerSettings.load(env={}, flags={"algo": "grpo", "grpo_epochs": "3", "train_device": "cpu"})
    cfg = replace(grpo_config(settings), group_size=4, lr=5e-2, grad_accum=2, max_grad_norm=0.0)
    assert cfg.epochs == 3 and grpo_config(TrainerSettings.load(env={}, flags={"algo": "grpo"})).epochs == 1
    trainer = GRPOTrainer(tiny_path, cfg, tmp_path)
    starts = []  # the weights each epoch's forward and backward ran with
    trainer.optimizer.register_step_pre_hook(
        lambda *_: starts.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
    )
    prompt, rewards = [5, 6, 7], [1.0, 0.0, 0.5, 0.0]
    completions = [[20, 21, 22, 2], [30, 31, 32, 2], [40, 41, 2], [50, 51, 52, 53]]
    m = trainer.step([make_group(tiny_path, prompt, completions, rewards)])
    assert m["updated"] and trainer.updates == len(starts) == cfg.epochs

    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    model = tiny_llama()
    per_epoch = []
    for weights in starts:
        model.load_state_dict(weights)
        with torch.no_grad():
            per_epoch.append([unpadded_logprobs(model, prompt, c) for c in completions])
    low = high = 0
    for epoch in per_epoch:
        for r, first, now in zip(rewards, per_epoch[0], epoch, strict=True):
            adv = (r - mean) / (std + cfg.adv_eps)
            for ratio in torch.exp(now - first).tolist():
                low += adv < 0 and ratio < 1 - cfg.clip_low
                high += adv > 0 and ratio > 1 + cfg.clip_high
    counted = sum(len(c) for c in completions) * cfg.epochs
    assert low > 0 and high > 0  # both bounds bind (7 and 5 of the 45 token-epochs)
    assert m["clip_low_frac"] == pytest.approx(low / counted, abs=1e-12)
    assert m["clip_high_frac"] == pytest.approx(high / counted, abs=1e-12)


def unpadded_logprobs(model, prompt, completion):
    """The logprob of each token of `completion` after `prompt`: one plain forward, no padding, no batch."""
    logits = model(torch.tensor([prompt + completion])).logits[0].float()
    picked = torch.log_softmax(logits, -1)[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    return picked.gather(-1, torch.tensor(completion)[:, None])[:, 0]


def _batches(path):
    prompt_a, prompt_b = [5, 6, 7], [11, 12]
    b1 = [
        make_group(path, prompt_a, [[20, 21, 2], [30, 31, 32, 2], [40, 2], [50, 51]], [1, 0, 0.5, 0]),
        make_group(path, prompt_b, [[60, 61], [62], [63, 64, 65], [66, 2]], [0, 0, 1, 1]),
    ]
    # the second batch was sampled by version 0 while the trainer holds version 1: off-policy, IS-weighted;
    # the behaviour logprobs are shifted so that some weights exceed the cap
    b2 = []
    for g, prompt, comps, rewards in (
        (0, prompt_a, [[22, 23, 2], [33, 34], [44, 45, 46, 2], [55]], [0, 1, 1, 0]),
        (1, prompt_b, [[70, 71, 72], [73, 2], [74], [75, 76]], [1, 0, 0, 0]),
    ):
        group = make_group(path, prompt, comps, rewards, version=0)
        b2.append([s._replace(logprobs=[lp - 0.9 * ((g + i) % 2) for lp in s.logprobs]) for i, s in enumerate(group)])
    return b1, b2


def test_checkpoint_resume_is_bit_identical(tiny_path, tmp_path):
    cfg = GRPOConfig(group_size=4, lr=1e-2, grad_accum=2, epochs=2, kl_coef=0.05, weight_decay=0.01)
    b1, b2 = _batches(tiny_path)

    a = GRPOTrainer(tiny_path, cfg, tmp_path / "a")
    a.step(b1)
    ckpt = a.checkpoint(tmp_path / "ckpt" / "grpo.pt")
    m_a = a.step(b2)
    assert m_a["off_policy_sequences"] == 8 and m_a["is_truncated_frac"] > 0
    # the second epoch is clipped against the proximal logprobs of the first: both bounds bind on some tokens
    assert m_a["clip_low_frac"] > 0 and m_a["clip_high_frac"] > 0 and m_a["kl"] > 0

    b = GRPOTrainer(tiny_path, cfg, tmp_path / "b")
    b.resume(ckpt)
    assert b.version == 1 and b.updates == 2
    m_b = b.step(b2)
    assert m_b["loss"] == m_a["loss"] and m_b["grad_norm"] == m_a["grad_norm"]
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert oa["param_groups"] == ob["param_groups"]
    for idx, st in oa["state"].items():
        assert st.keys() == ob["state"][idx].keys()
        assert all(torch.equal(st[k], ob["state"][idx][k]) for k in st)
    assert a.version == b.version == 2 and a.updates == b.updates == 4
    # and the step really moved the weights (the comparison above is not between two untouched models)
    fresh = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_path)).state_dict()
    assert any(not torch.equal(fresh[k], sa[k]) for k in sa)


def _default_tokenizer_folder():
    try:
        from weights.model import resolve_model

        return resolve_model(None)
    except Exception:  # the default model is not installed here: test the weights alone
        return None


def test_save_writes_a_loadable_folder_with_its_digest(tmp_path):
    from weights.io import load_master
    from weights.model import weights_digest

    base = tmp_path / "base"
    tokenizer_src = _default_tokenizer_folder()
    tiny_llama(vocab=49152 if tokenizer_src else 128, hidden=16).save_pretrained(base)
    if tokenizer_src:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
            if (tokenizer_src / name).exists():
                shutil.copy2(tokenizer_src / name, base / name)

    trainer = GRPOTrainer(base, GRPOConfig(group_size=2, lr=1e-2), tmp_path / "run")
    comps = [[20, 21, 2], [30, 31]]
    trainer.step([make_group(base, [5, 6], comps, [1.0, 0.0])])
    folder, digest = trainer.save(1)
    assert folder == tmp_path / "run" / "policy" / "v000001"
    assert digest == weights_digest(folder) and digest.startswith("sha256:")
    assert [p.name for p in folder.parent.iterdir()] == ["v000001"]  # no temporary folder left behind

    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).state_dict()
    mine = trainer.model.state_dict()
    assert loaded.keys() == mine.keys() and all(torch.equal(loaded[k], mine[k]) for k in mine)
    names = set(dict(trainer.model.named_parameters()))
    assert set(load_master(folder)) <= names  # what a generator's engine writes, by checkpoint name
    if tokenizer_src:
        tok = transformers.AutoTokenizer.from_pretrained(str(folder))
        assert tok.encode("hello") == transformers.AutoTokenizer.from_pretrained(str(tokenizer_src)).encode("hello")

    # saving the same version again keeps the folder (same bytes); new weights replace it
    assert trainer.save(1) == (folder, digest)
    trainer.step([make_group(base, [5, 6], comps, [0.0, 1.0])])
    folder2, digest2 = trainer.save(1)
    assert folder2 == folder and digest2 != digest and digest2 == weights_digest(folder)
    assert [p.name for p in folder.parent.iterdir()] == ["v000001"]


def test_pad_right():
    out, mask = pad_right([torch.tensor([1.0, 2.0]), torch.tensor([3.0])], value=-1.0)
    assert out.tolist() == [[1.0, 2.0], [3.0, -1.0]] and mask.tolist() == [[True, True], [True, False]]


def test_bf16_mixed_steps_close_to_fp32_and_keeps_fp32_weights(tiny_path, tmp_path):
    """`precision="bf16-mixed"` runs the step's passes under autocast: its gradient norm and update are the fp32
    step's within bf16's rounding, the weights it updates stay fp32, and it is not the fp32 step itself."""
    b1, _ = _batches(tiny_path)
    steps = {}
    for precision in ("fp32", "bf16-mixed"):
        trainer = GRPOTrainer(tiny_path, GRPOConfig(group_size=4, lr=1e-3, precision=precision), tmp_path / precision)
        start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        metrics = trainer.step(b1)
        delta = torch.cat([(v - start[k]).flatten() for k, v in trainer.model.state_dict().items()])
        steps[precision] = (metrics, delta, {p.dtype for p in trainer.model.parameters()})
    (full, full_delta, full_dtypes), (mixed, mixed_delta, mixed_dtypes) = steps["fp32"], steps["bf16-mixed"]
    assert full_dtypes == mixed_dtypes == {torch.float32}
    # (the loss's value is no test here: on-policy at one epoch the ratio is 1 whatever the logprobs)
    assert mixed["grad_norm"] == pytest.approx(full["grad_norm"], rel=0.01)  # measured: 0.08% apart
    assert float(torch.nn.functional.cosine_similarity(full_delta, mixed_delta, dim=0)) > 0.98  # measured: 0.997
    assert not torch.equal(full_delta, mixed_delta)  # autocast took part


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision"):
        GRPOConfig(precision="fp16")


XEON_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
XEON_OLD = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
SAPPHIRE = "flags\t\t: fpu avx512f amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd crc32 atomics\n"


def test_auto_precision_is_bf16_mixed_only_where_the_cpu_computes_in_bf16():
    from trainer.grpo import step_precision
    from weights.device import cpu_has_bf16

    found = [cpu_has_bf16(c) for c in (XEON_BF16, XEON_OLD, SAPPHIRE, GRAVITON3, GRAVITON2, "")]
    assert found == [True, False, True, True, False, False]
    assert step_precision("fp32", "cuda") == "fp32" and step_precision("bf16-mixed", "cpu") == "bf16-mixed"
    if not torch.cuda.is_available():
        assert step_precision("auto", "cuda") == "fp32"
    assert step_precision("auto", "cpu") == ("bf16-mixed" if cpu_has_bf16() else "fp32")
