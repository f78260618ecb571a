"""The `hf` engine: a transformers model, batched, on CPU (the default) or one GPU.

Prompts of a call are left-padded into one batch (`padding_side="left"`: decoder-only models continue
from the last real token). Behaviour logprobs are recorded while sampling from the raw logits of each step
(before temperature and top-p): one log-softmax per step, not a second forward pass.
ES weights are written straight into the model's parameters (`copy_` casts the fp32 values into the
model's dtype); GRPO weights are loaded from a safetensors folder by checkpoint name.

One call generates every row of an order (its problems x n samples), so a GPU gets the whole batch at once.
Low-rank ES members (weights/es.py `noise="lowrank"`) go through `es_members`: the center stays in the
weights and every member's rows are generated in that one call, each linear layer adding to its output the
row's own low-rank term (x B_i) A_i^T through a forward hook, two batched matmuls per layer over the
members (`_LowRankRows`). Not PEFT's mixed-adapter batch: PEFT runs one sub-batch per adapter through each
layer (a Python loop over the population at every layer and step), where the members' factors stacked in
one tensor need two `bmm` calls whatever the population; no weight is written per member either way.
A call's cost follows the tokens its rows write, not its longest row: the engine runs its own decoding loop
(`_decode`, transformers' greedy or multinomial step on a DynamicCache, the same positions, mask and logits
processors) and a row leaves the batch at the step it writes EOS: its KV-cache rows, mask row and position
go, and in a low-rank call its slot in its member's group (`_LowRankRows.select`; a member whose rows have
all ended leaves the low-rank term's computation), so every later step runs on the rows still writing. The
loop's KV cache is written in place (`_InPlaceLayer`: room for the whole call, where transformers'
DynamicLayer concatenates the whole cache again at every step). A greedy call's last rows (up to eight)
look ahead: a step feeds up to `lookahead` tokens drafted from the row's own text (prompt lookup) after its
last one and keeps those the model chooses itself, so a member that runs on in a loop after the others ended
writes several tokens a step, where a step on a few rows costs about what a step on eight does. Greedy answers
are those of `generate` (with the look-ahead, up to float rounding: tested token for token); sampling
draws `torch.multinomial`'s exponential noise for the call's whole batch at every step as `generate` does,
so a seed gives the same samples and logprobs whichever rows have left (tests/producers/test_hf_engine.py).
`drop_finished=False` (and the static cache) use transformers' `generate`, every row decoding until the
longest ends. transformers' own continuous batching (`generate_batch`, paged attention) is not used: it
packs every request's tokens into one flat sequence on a thread of its own, where a member's rows could no
longer be told apart by the low-rank hooks, and it samples with its own generator.
`kv_cache="static"` preallocates the KV cache to the call's full length (transformers' StaticCache), which
lets transformers compile the decoding step with torch.compile on a GPU (its auto-compile criteria: a
compilable cache on cuda): the overhead that dominates short sequences of a small model. Whether it pays
depends on the GPU and the shapes (each new batch shape compiles again): `python -m ops bench generator
--device cuda --kv-cache static` measures it, and `make gpu-check` records both.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from producers.engine import EngineStats, Sample, Sampling, checked_dtype
from streams import faults
from weights.es import ESWeights, member_factors
from weights.io import digest, load_master

LOOKAHEAD = 8  # drafted tokens a step feeds after a row's last one at most, once a greedy call has few rows left
LOOKAHEAD_POSITIONS = 16  # "few": a step of 16 positions or fewer is bound by reading the weights on a CPU (NOTES)


class _RawLogprobs(transformers.LogitsProcessor):
    """Records log-softmax(raw logits) of each step; the token sampled at step t is read at step t+1.

    Placed first in the processor list, it sees the model's logits before temperature and top-p.
    """

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []  # per step: logprob of the token sampled there, (batch,)
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(batch, steps) logprobs, given the tokens sampled at the final step."""
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, last_tokens[:, None]).squeeze(1))
            self._pending = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros((last_tokens.shape[0], 0))


class _InPlaceLayer(transformers.cache_utils.DynamicLayer):
    """transformers' DynamicLayer (one layer of the KV cache our decoding loop keeps), with its keys and values
    in buffers that have room for the whole call (the prompt and every new token): a step writes its token's
    key and value in place and hands attention a view of the filled part, where DynamicLayer concatenates, a
    copy of the layer's whole cache at every step (its cost grows with the length written). Rows that leave
    (`batch_select_indices`) are dropped from the buffers as DynamicLayer drops them from its tensors."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            shape = (*key_states.shape[:2], self.capacity, key_states.shape[-1])
            self._keys, self._values = key_states.new_empty(shape), value_states.new_empty(shape)
        end = self.length + key_states.shape[-2]
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self.keys, self.values = self._keys[:, :, : self.length], self._values[:, :, : self.length]

    def reserve(self, length: int) -> None:
        """Room for `length` entries: the look-ahead's drafted tokens take room beyond the call's tokens
        (`_decode`); the buffers grow, the filled part copied, while few rows are left."""
        if length > self.capacity:
            self.capacity = max(length, 2 * self.capacity)
            grown = (*self._keys.shape[:2], self.capacity, self._keys.shape[3])
            keys, values = self._keys.new_empty(grown), self._values.new_empty(grown)
            keys[:, :, : self.length], values[:, :, : self.length] = self.keys, self.values
            self._keys, self._values = keys, values


def lookup_draft(history: list[int], most: int, longest: int = 3, shortest: int = 2) -> list[int]:
    """Prompt-lookup drafting (transformers' `prompt_lookup_num_tokens`, vLLM's `ngram` speculator): the
    tokens that followed the latest earlier occurrence of the history's last n tokens, n from `longest` down to
    `shortest`, `most` of them at most. The copy may run into the tokens it copies (a loop of period p drafts
    the loop on, as LZ77 copies): a row repeating itself gets its whole look-ahead. [] where nothing matches."""
    for n in range(longest, shortest - 1, -1):
        if len(history) <= n:
            continue
        tail = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start : start + n] == tail:
                source, draft = start + n, []
                while len(draft) < most:
                    at = source + len(draft)
                    draft.append(history[at] if at < len(history) else draft[at - len(history)])
                return draft
    return []


class _LowRankRows:
    """Forward hooks that add member i's low-rank term to the output of each perturbed linear layer for its
    rows: the batch is member-major (rows [i*k, (i+1)*k) are member i's), so one layer's input (M*k, t, in)
    is viewed as (M, k*t, in) and the term is bmm(bmm(x, B), A^T) with A, B stacked over the members.

    When the decoding loop drops finished rows (`select`), the rows stay member-major but their members'
    counts differ, and a member whose rows have all ended has none. The term is then computed for the members
    that still have rows (`present`; their factors gathered again each time members leave, so a step reads only theirs:
    the call's last rows, one or two members', do not read the whole population's factors every step). Where
    those members' counts differ, each row has a slot in a (P, cmax) grid (member, place among its member's
    rows), the rows are scattered into the grid, the same two bmm run on it (empty slots are zeros and are
    never read back), and the rows are gathered out of it. The term is r (4) columns wide, so the empty slots
    cost next to nothing; the layer's own matmul runs on the kept rows only."""

    def __init__(
        self, model: torch.nn.Module, stacked: dict[str, tuple[torch.Tensor, torch.Tensor]], rows: int
    ) -> None:
        members = next(iter(stacked.values()))[0].shape[0] if stacked else 1
        device = next(iter(stacked.values()))[0].device if stacked else "cpu"
        self.members = members
        self.member = torch.arange(members, device=device).repeat_interleave(rows // members)  # row -> member
        self.present: torch.Tensor | None = None  # the members with rows, where some have none; None: all
        self.slot: torch.Tensor | None = None  # row -> place in the (P * cmax) grid; None: each present has cmax
        self.width = rows // members  # cmax
        self.leaves = 0  # how many times members left (all their rows ended): a hook gathers its factors anew
        self.handles = []
        for name, (a, b) in stacked.items():
            module = model.get_submodule(name.removesuffix(".weight"))
            self.handles.append(module.register_forward_hook(self._hook(a, b)))

    def select(self, keep: torch.Tensor) -> None:
        """The batch keeps rows `keep` (indices into the current rows, ascending): members follow their rows."""
        self.member = self.member[keep]
        present, local = torch.unique_consecutive(self.member, return_inverse=True)  # rows stay member-major
        counts = torch.bincount(local)
        width = int(counts.max())
        start = torch.cumsum(counts, 0) - counts  # first row of each present member
        slot = local * width + torch.arange(len(local), device=local.device) - start[local]
        if len(present) < (self.members if self.present is None else len(self.present)):  # members only leave
            self.present, self.leaves = present, self.leaves + 1
        self.slot = None if bool((counts == width).all()) else slot
        self.width = width

    def _hook(self, a: torch.Tensor, b: torch.Tensor):  # a: (M, out, r), b: (M, in, r)
        a_t = a.transpose(1, 2).contiguous()
        gathered: list = [0, a_t, b]  # (self.leaves when gathered, A^T, B) of the present members

        def add_term(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            x, slot = inputs[0], self.slot
            if self.present is not None and gathered[0] != self.leaves:
                gathered[:] = [self.leaves, a_t.index_select(0, self.present), b.index_select(0, self.present)]
            _, at, bs = gathered
            members = bs.shape[0]
            if slot is None:
                low = torch.bmm(x.reshape(members, -1, x.shape[-1]), bs)  # (P, k*t, r): member-major rows
                output.view(members, -1, output.shape[-1]).baddbmm_(low, at)  # += (x B) A^T, in place
                return
            grid = members * self.width
            xs = x.new_zeros((grid, *x.shape[1:]))
            xs[slot] = x
            low = torch.bmm(xs.view(members, -1, x.shape[-1]), bs)
            out = output.new_zeros((grid, *output.shape[1:]))
            out[slot] = output
            out.view(members, -1, output.shape[-1]).baddbmm_(low, at)  # the same fused op as above, per slot
            output.copy_(out[slot])

        return add_term

    def __enter__(self) -> _LowRankRows:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()


class HFEngine:
    name = "hf"

    def __init__(
        self,
        model_path: Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        snapshot_dir: str | os.PathLike | None = None,
        snapshot_every: int = 0,
        keep: int = 2,
        threads: int = 0,
        kv_cache: str = "dynamic",
        drop_finished: bool = True,
        lookahead: int = LOOKAHEAD,
    ) -> None:
        if kv_cache not in ("dynamic", "static"):
            raise ValueError(f"kv_cache {kv_cache!r}: use dynamic or static")
        self.kv_cache = kv_cache
        self.drop_finished = drop_finished  # our decoding loop (rows leave as they end); False: transformers' generate
        self.lookahead = lookahead  # drafted tokens a greedy call's last rows feed a step (`_decode`); 0: none
        dtype = checked_dtype(("float32" if device == "cpu" else "bfloat16") if dtype == "auto" else dtype)
        if threads:
            torch.set_num_threads(threads)
        self.model_path = Path(model_path)
        self.device = device
        self.dtype = getattr(torch, dtype)
        started = time.monotonic()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(model_path), dtype=self.dtype)
        self.model.to(device).eval()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_path))
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.stats = EngineStats(
            extra={
                "engine": self.name,
                "device": device,
                "dtype": dtype,
                "kv_cache": kv_cache,
                "load_s": round(time.monotonic() - started, 2),
            }
        )
        self.es = ESWeights(
            lambda: load_master(self.model_path, device),
            self._write,
            snapshot_dir=snapshot_dir,
            snapshot_every=snapshot_every,
            keep=keep,
            device=device,
        )
        self._params: dict[str, torch.Tensor] | None = None
        self._rows: _LowRankRows | None = None  # the low-rank hooks of an `es_members` call, while it runs
        self.row_steps = 0  # rows x positions the model computed a next token for (a row of n tokens: n, or
        # more where the look-ahead fed drafted tokens the model did not choose)

    # -- weights ---------------------------------------------------------------------------------------

    def _parameters(self) -> dict[str, torch.Tensor]:
        """Checkpoint name -> live tensor (tied weights appear under the name the checkpoint uses)."""
        if self._params is None:
            self._params = dict(self.model.state_dict(keep_vars=True))
        return self._params

    @torch.no_grad()
    def _write(self, named: Any) -> None:
        params = self._parameters()
        for name, value in named:
            target = params.get(name)
            if target is None:
                raise KeyError(f"weight {name!r} is not a parameter of the loaded model")
            target.data.copy_(value)

    def es_add_step(self, version: int, step: dict[str, Any]) -> None:
        self.es.add_step(version, step)

    def es_forget_after(self, version: int) -> None:
        self.es.forget_after(version)

    def es_use(self, version: int, seed: int | None, sign: int = 1, sigma: float = 0.0, rank: int = 0) -> None:
        started = time.monotonic()
        if self.es.use(version, seed, sign, sigma, rank):
            self.stats.policy_switches += 1
            self.stats.policy_s += time.monotonic() - started

    def es_members(
        self,
        version: int,
        members: list[tuple[int, int]],
        sigma: float,
        rank: int,
        prompts: list[list[int]],
        sampling: Sampling,
    ) -> list[list[list[Sample]]]:
        """Low-rank members (seed, sign) of center `version` on the same prompts, in one generate call:
        [member][prompt][sample]. The weights hold the center throughout."""
        if not members or not prompts:
            return [[] for _ in members]
        started = time.monotonic()
        self.es_use(version, None)
        master = self.es.center(version)
        per_member = [member_factors(master, seed, sign, sigma, rank) for seed, sign in members]
        stacked = {
            name: tuple(torch.stack([f[name][i] for f in per_member]).to(self.device, self.dtype) for i in (0, 1))
            for name in per_member[0]
        }
        self.stats.policy_s += time.monotonic() - started
        batch = [p for _ in members for p in prompts]
        with _LowRankRows(self.model, stacked, len(batch) * sampling.n) as hooks:
            self._rows = hooks  # the decoding loop tells it which rows it keeps
            try:
                rows = self.generate(batch, sampling)
            finally:
                self._rows = None
        return [rows[i * len(prompts) : (i + 1) * len(prompts)] for i in range(len(members))]

    def es_digest(self, version: int) -> str:
        return digest(self.es.center(version))

    def load_weights(self, folder: Path) -> None:
        started = time.monotonic()
        self._write(load_master(folder, self.device).items())
        self.es.current = None
        self.stats.policy_switches += 1
        self.stats.policy_s += time.monotonic() - started

    # -- sampling --------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[Sample]]:
        if not prompts:
            return []
        faults.point("engine.generate")  # an engine that fails every call (tests/trainer/test_no_progress.py)
        started = time.monotonic()
        pad = self.tokenizer.pad_token_id
        batch = [p for p in prompts for _ in range(sampling.n)]  # n rows per prompt (greedy allows no n > 1)
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        if self.drop_finished and self.kv_cache == "dynamic":
            completions, logprobs = self._decode(ids.to(self.device), mask.to(self.device), sampling)
        else:
            completions, logprobs = self._generate(ids.to(self.device), mask.to(self.device), sampling)
        eos = set() if sampling.ignore_eos else set(self._eos_ids())
        samples: list[list[Sample]] = [[] for _ in prompts]
        tokens = 0
        for row in range(completions.shape[0]):
            seq = completions[row].tolist()
            end = next((k + 1 for k, t in enumerate(seq) if t in eos), None)
            finish = "stop" if end is not None else "length"
            seq = seq[: end if end is not None else len(seq)]
            tokens += len(seq)
            lp = logprobs[row, : len(seq)].tolist() if logprobs is not None else None
            text = self.tokenizer.decode(seq, skip_special_tokens=True)
            samples[row // sampling.n].append(Sample(seq, text, lp, finish))
        self.stats.generated_tokens += tokens
        self.stats.prompts += len(prompts)
        self.stats.generate_s += time.monotonic() - started
        return samples

    def _generate(
        self, ids: torch.Tensor, mask: torch.Tensor, sampling: Sampling
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """transformers' `generate`: every row decodes until the longest ends (the static cache needs it: one
        shape for the whole call). (rows, steps) tokens and logprobs on the host."""
        if sampling.ignore_eos:
            raise ValueError("ignore_eos needs the engine's own decoding loop (drop_finished, the dynamic cache)")
        pad = self.tokenizer.pad_token_id
        recorder = _RawLogprobs() if sampling.logprobs else None
        greedy = sampling.temperature == 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "do_sample": not greedy,
            "pad_token_id": pad,
            "logits_processor": transformers.LogitsProcessorList([recorder] if recorder else []),
        }
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        if self.kv_cache == "static":
            kwargs["cache_implementation"] = "static"
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        out = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        self.row_steps += out.shape[0] * (out.shape[1] - ids.shape[1])
        # The recorder's logprobs live on the model's device: finish them there, then bring both to the host.
        logprobs = recorder.finish(out[:, -1]).cpu() if recorder else None
        return out[:, ids.shape[1] :].cpu(), logprobs

    def _decode(
        self, ids: torch.Tensor, mask: torch.Tensor, sampling: Sampling
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoding loop of transformers' `generate` (greedy or multinomial sampling, a DynamicCache, the
        same positions, mask and logits processors), except that a row leaves the batch at the step it writes
        EOS: its rows of the KV cache, attention mask and positions are dropped (and its low-rank member's
        slot, `_LowRankRows.select`), so a step costs the rows still writing. The tokens are those of
        `generate`: greedy is argmax of the same logits; sampling draws the exponential noise of
        `torch.multinomial` (argmax of p / q, q ~ Exp(1)) for the call's full batch at every step, as
        `generate` does, and each kept row reads its own row of it, so a seed gives the same samples whichever
        rows have left.

        The tail of a greedy call looks ahead: once a step's rows times the tokens fed fit in
        `LOOKAHEAD_POSITIONS`, each row feeds its last token and up to `lookahead` drafted ones (`lookup_draft`:
        a row repeating itself drafts its own loop), and keeps the drafted tokens the model chooses itself, up
        to the first it would not, and the model's choice there: at least one token a step, each row its own
        number. The KV entries of the drafted tokens a row did not keep stay in the cache, masked out of its
        attention for good, and each row's position follows its own tokens. A step on five rows costs about
        half a step on sixty (the weights are read once a step), so members that run on in loops after the
        others ended write several tokens a step. The tokens are the argmax of the same model's logits,
        computed several positions at a time: those of one at a time up to float rounding
        (tests/producers/test_hf_engine.py checks them token for token). (rows, steps) tokens (pad after EOS)
        and raw logprobs, on the host."""
        rows, steps = ids.shape[0], sampling.max_new_tokens
        pad = self.tokenizer.pad_token_id
        eos = torch.tensor([] if sampling.ignore_eos else self._eos_ids(), dtype=torch.long, device=ids.device)
        greedy = sampling.temperature == 0
        warpers = transformers.LogitsProcessorList()
        if not greedy and sampling.temperature != 1.0:
            warpers.append(transformers.TemperatureLogitsWarper(sampling.temperature))
        if not greedy and sampling.top_p < 1.0:
            warpers.append(transformers.TopPLogitsWarper(sampling.top_p))
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        tokens = torch.full((rows, steps), pad, dtype=torch.long, device=ids.device)
        logprobs = torch.zeros((rows, steps), dtype=torch.float32, device=ids.device) if sampling.logprobs else None
        alive = torch.arange(rows, device=ids.device)  # the call's row of each row of the batch
        position = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        cache = transformers.DynamicCache(config=self.model.config)
        in_place = all(type(layer) is transformers.cache_utils.DynamicLayer for layer in cache.layers)
        if in_place:  # not sliding windows
            cache.layers = [_InPlaceLayer(ids.shape[1] + steps) for _ in cache.layers]
        look = self.lookahead if greedy and in_place else 0
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        position = position[:, -1:]  # of the first token fed last (the prompt's last)
        prompts = []  # each row's prompt (left-padded) on the host, what drafting looks up in: read once a call
        if look:
            lengths = mask.sum(dim=-1).cpu().tolist()
            prompts = [r[len(r) - n :] for r, n in zip(ids.cpu().tolist(), lengths, strict=True)]
        written = torch.zeros(rows, dtype=torch.long, device=ids.device)  # tokens each row of the batch wrote
        drafts = ids.new_empty((rows, 0))  # the drafted tokens fed after each row's last one
        while True:
            fed = drafts.shape[1] + 1
            logits = out.logits[:, -fed:].to(dtype=torch.float32)  # (alive, fed, vocab)
            self.row_steps += logits.shape[0] * fed
            if greedy:
                chosen = torch.argmax(logits, dim=-1)  # (alive, fed): the model's token after each fed one
                count = (drafts == chosen[:, :-1]).int().cumprod(dim=1).sum(dim=1) + 1  # drafts it chose itself, +1
            else:
                probs = torch.softmax(warpers(None, logits[:, -1]), dim=-1)
                noise = torch.empty((rows, probs.shape[-1]), dtype=probs.dtype, device=probs.device).exponential_(1)
                chosen = torch.argmax(probs / noise[alive], dim=-1)[:, None]
                count = torch.ones_like(written)
            count = torch.minimum(count, steps - written)
            place = torch.arange(fed, device=ids.device)
            ended = torch.isin(chosen, eos) & (place < count[:, None])
            first = torch.where(ended.any(dim=1), ended.int().argmax(dim=1), fed)
            count = torch.minimum(count, first + 1)  # a row's EOS is its last token
            row, col = (place < count[:, None]).nonzero(as_tuple=True)
            tokens[alive[row], written[row] + col] = chosen[row, col]
            if logprobs is not None:
                raw = torch.log_softmax(logits, dim=-1).gather(2, chosen[..., None]).squeeze(2)
                logprobs[alive[row], written[row] + col] = raw[row, col]
            written = written + count
            going = (first >= count) & (written < steps)
            if not bool(going.any()):
                break
            if fed > 1:  # the KV entries of drafted tokens a row did not keep stay in the cache, masked out
                mask[:, -fed:] = (place < count[:, None]).to(mask.dtype)
            if not bool(going.all()):
                keep = going.nonzero().squeeze(1)
                alive, chosen, count, written = alive[keep], chosen[keep], count[keep], written[keep]
                position, mask = position[keep], mask[keep]
                for layer in cache.layers:
                    layer.batch_select_indices(keep)
                if self._rows is not None:
                    self._rows.select(keep)
            position = position + count[:, None]  # of each row's last token: fed next
            drafts = self._drafts(prompts, tokens, alive, written, steps, look)
            fed_ids = torch.cat([chosen.gather(1, (count - 1)[:, None]), drafts], dim=1)
            mask = torch.cat([mask, mask.new_ones(fed_ids.shape)], dim=-1)
            if in_place and mask.shape[1] > cache.layers[0].capacity:  # drafted tokens took room of their own
                for layer in cache.layers:
                    layer.reserve(mask.shape[1])
            out = self.model(
                input_ids=fed_ids,
                attention_mask=mask,
                position_ids=position + torch.arange(fed_ids.shape[1], device=ids.device),
                past_key_values=cache,
                use_cache=True,
            )
        return tokens.cpu(), logprobs.cpu() if logprobs is not None else None

    def _drafts(
        self,
        prompts: list[list[int]],
        tokens: torch.Tensor,
        alive: torch.Tensor,
        written: torch.Tensor,
        steps: int,
        look: int,
    ) -> torch.Tensor:
        """(alive, d) drafted tokens to feed after each row's last one: `lookup_draft` of each row's prompt and
        answer so far, d the longest any row drafted (shorter drafts padded: a pad the model would not choose
        is not kept, one it would is its choice). d keeps a step within `LOOKAHEAD_POSITIONS` positions, so
        drafting starts once `LOOKAHEAD_POSITIONS // 2` rows or fewer are left; `look` drafted tokens at most."""
        width = min(look, LOOKAHEAD_POSITIONS // alive.shape[0] - 1)
        if width <= 0:
            return tokens.new_empty((alive.shape[0], 0))
        done = written.cpu().tolist()
        answers = tokens[alive, : max(done)].cpu().tolist()  # the rows' answers so far, in one copy to the host
        drafts = [
            lookup_draft(prompts[row] + answer[:n], min(width, steps - n - 1))
            for row, n, answer in zip(alive.cpu().tolist(), done, answers, strict=True)
        ]
        width = max(map(len, drafts))
        pad = self.tokenizer.pad_token_id
        padded = [d + [pad] * (width - len(d)) for d in drafts]
        return torch.tensor(padded, dtype=torch.long, device=tokens.device).reshape(len(drafts), width)

    def _eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return list(eos) if isinstance(eos, list | tuple) else [eos]

    def close(self) -> None:
        self._params = None
