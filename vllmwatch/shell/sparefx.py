"""The daemon's side of the sleeping spare (issue 34 points 2-3): its plan from this
machine's facts and its command. Imported only when `[spare]` is considered
(SpareConfig.considered); the plan says on or off and why, and only an "on" imports the
spare's tree and the core's failover (shell/sparetree.py).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from vllmwatch.config import command, flags, launch, redact, safefile, vllmflags, vllminfo
from vllmwatch.config.errors import ConfigError
from vllmwatch.config.launch import parallel_sizes
from vllmwatch.config.modellen import BadModelValue, model_max_len
from vllmwatch.config.schema import Config
from vllmwatch.config.spare import (
    Footprint,
    SpareFacts,
    SparePlan,
    kv_bytes_per_token,
    plan_spare,
    spare_gpu,
)
from vllmwatch.config.spare import with_flags as _with_flags
from vllmwatch.core.samples import MemorySample
from vllmwatch.logfn import LogFn
from vllmwatch.prewarm import pagecache
from vllmwatch.prewarm.runner import model_dir
from vllmwatch.shell import groupfile
from vllmwatch.shell.child import instance_id
from vllmwatch.shell.memory import MemorySampler
from vllmwatch.shell.platform import read_meminfo

if TYPE_CHECKING:
    from vllmwatch.shell.sparerun import SpareFx
    from vllmwatch.shell.sparetree import SpareCommand

T = TypeVar("T")
SUN_PATH_MAX = 107  # a Unix socket's path (sun_path)


def _places(environ: Mapping[str, str]) -> tuple[str, str]:
    """Where the spare's socket folder may go, in order: the state directory by the rule,
    then one under /tmp (for a state directory too deep for a socket's path)."""
    return groupfile.state_dir_candidate(environ), TMP_PLACE.format(uid=os.geteuid())


TMP_PLACE = "/tmp/vllmwatch-{uid}"


def socket_path(environ: Mapping[str, str], instance: str) -> str | None:
    """Where the spare listens: a directory of vllmwatch's private one that no other user may
    enter (the state directory may be 0755: systemd's StateDirectoryMode default), or one
    under /tmp when that path is too long for a socket; None: no such place."""
    name = groupfile.spare_socket_name(instance)
    for where in map(safefile.private_dir, _places(environ)):
        room = where is not None and len(os.path.join(where, "spare", name)) <= SUN_PATH_MAX
        closed = safefile.closed_dir(os.path.join(where, "spare")) if room and where else None
        if closed is not None:
            return os.path.join(closed, name)
    return None


def socket_place_known(environ: Mapping[str, str], instance: str) -> bool:
    """Whether socket_path would find a place, judged without making or changing anything
    (`vllmwatch check` runs before the daemon, as another user at times): a place is one
    short enough whose folders are ours and writable by nobody else, or do not exist yet
    below a directory we may create in (closed_dir closes a looser mode of ours itself)."""
    name = groupfile.spare_socket_name(instance)
    return any(len(os.path.join(where, "spare", name)) <= SUN_PATH_MAX and _could_be_ours(
        where) and _could_be_ours(os.path.join(where, "spare")) for where in _places(environ))


def _could_be_ours(path: str) -> bool:
    """safefile.private_dir(path) would give path: a trusted directory, not a link; or none
    yet, under a directory we may create in."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        above = os.path.dirname(path.rstrip("/")) or "/"
        while not os.path.lexists(above):
            above = os.path.dirname(above)
        return os.path.isdir(above) and os.access(above, os.W_OK | os.X_OK)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and safefile.trusted(st)


def socket_problem(environ: Mapping[str, str], instance: str) -> tuple[str, str]:
    """Why socket_path found no place, each place it tried named; and what to change."""
    name, (state, tmp) = groupfile.spare_socket_name(instance), _places(environ)
    said = []
    for where in (state, tmp):
        path = os.path.join(where, "spare", name)
        said.append(f"{path}: {len(path)} characters, over the {SUN_PATH_MAX} a Unix socket's "
                    "path may have" if len(path) > SUN_PATH_MAX else f"{os.path.dirname(path)}: "
                    "not a directory of this user's alone (its owner, its mode or a link)")
    return "; ".join(said), (
        f"give vllmwatch a state directory of at most {SUN_PATH_MAX - len(name) - 7} "
        f"characters (StateDirectory= in its unit, or STATE_DIRECTORY), or make {tmp} a "
        "directory of this user's alone (mode 0700), then restart vllmwatch")


def facts(config: Config, sample: MemorySample, unified: bool, uds_path: str,
          environ: Mapping[str, str]) -> SpareFacts:
    """What the plan needs of this machine and model; None where it cannot be read. Whether
    vLLM has sleep mode and --uds comes from its cached flag list (`check`, or the first
    launch, learns it; never asked here: the start does not wait on vLLM's import)."""
    mem = read_meminfo()
    version = vllminfo.version(config.vllm.command)
    sleep_mode, uds = vllmflags.spare_support(vllmflags.known_flags(
        config.vllm.command, version, vllmflags.default_cache_dir(config, environ),
        ask=False))
    return model_facts(on_gpu(SpareFacts(
        platform="cpu" if not config.vllm.uses_gpu else "unified" if unified else "discrete",
        uds_path=uds_path, host_available_mib=mem.available_mib if mem is not None else None,
        sleep_mode=sleep_mode, uds=uds), config, sample), config, environ)


def on_gpu(base: SpareFacts, config: Config, sample: MemorySample) -> SpareFacts:
    """`base` with the figures of the spare's GPU for `config` (config/spare.spare_gpu) in
    `sample`: its total, and what others use on it."""
    gpu = spare_gpu(config.vllm.gpus, sample.device_total_mib)
    return replace(base, gpu_total_mib=sample.device_total_mib.get(gpu) if gpu is not None
                   else None, others_mib=sample.device_used_mib.get(gpu)
                   if gpu is not None else None)


def model_facts(base: SpareFacts, config: Config, environ: Mapping[str, str]) -> SpareFacts:
    """`base` with the model's own figures (its weights, KV bytes per token, context)."""
    problems: list[str] = []
    weights, per_token, max_len = model_figures(config, environ, str(flags_of(config).get(
        "kv-cache-dtype", "auto")), problems)
    return replace(base, weights_mib=weights, kv_bytes_per_token=per_token,
                   model_max_len=max_len, model_problem=problems[0] if problems else None)


def model_figures(config: Config, environ: Mapping[str, str], kv_dtype: str,
                  problems: list[str] | None = None
                  ) -> tuple[float | None, int | None, int | None]:
    """(weights MiB, KV bytes per token, the model's context length) from its local files: a
    path, or a Hub id already downloaded (found as the child finds it: its HF_HOME). `vllmwatch
    check` reads these too, so the check and the daemon say the same plan. A figure whose
    keys hold a value of the wrong kind (NaN, a string: config/modellen.py) is unknown, as
    for an unreadable config.json, and the problem, naming the file, goes to `problems`."""
    where = model_dir(config, environ)
    files = pagecache.weight_files(where) if where is not None else []
    weights = sum(f.stat().st_size for f in files) / 2**20 if files else None
    cfg: dict[str, Any] = {}
    if where is not None and where.is_dir():
        text = safefile.text_within(where / "config.json", safefile.MAX_MODEL_CONFIG)
        try:
            got = json.loads(text) if text is not None else None
            cfg = got if isinstance(got, dict) else {}
        except ValueError:
            cfg = {}
    said = problems if problems is not None else []
    file = str(where / "config.json") if where is not None else "config.json"
    per_token = _figure(lambda: kv_bytes_per_token(cfg, kv_dtype), file, said) if cfg else None
    found = _figure(lambda: model_max_len(cfg), file, said) if cfg else None
    return weights, per_token, found[0] if found else None


def _figure(read: Callable[[], T], file: str, problems: list[str]) -> T | None:
    """read(), or None with its problem said when a key holds a value of the wrong kind."""
    try:
        return read()
    except BadModelValue as exc:
        problems.append(exc.text(file))
        return None


def flags_of(config: Config) -> dict[str, object]:
    """The serving command's {flag: value} as the plan reads them (dashes): [vllm.args], with
    extra_args over them as vLLM reads its argv (`check` refuses a flag given twice), and
    the parallel sizes vllm.env_file gives (its other values are secret, and no size of the
    plan's). Before, a `--gpu-memory-utilization` or a TP=2 in extra_args or the env file
    was planned as absent: the spare sized beside one GPU's engine of the wrong setting."""
    extra = config.vllm.extra_args
    found = flags.table(config.vllm.args, extra)
    try:
        _, file_args = command.read_env_file(config)
    except ConfigError:  # the launch says what is wrong with it
        file_args = []
    sizes = parallel_sizes(found, [*extra, *file_args])
    found.update({"tensor-parallel-size": sizes["tp"], "pipeline-parallel-size": sizes["pp"]})
    return found


class Planner:
    """The spare's plan and command from a config: at the daemon's start, and again when a
    reload changed what vLLM runs (the spare serves what the serving engine serves). The
    machine's figures stay those measured at the start (the GPU was ours alone then: beside
    a running engine the plan would count it as another's memory); the model's are re-read."""

    def __init__(self, base: SpareFacts, environ: Mapping[str, str], log: LogFn,
                 start: MemorySample | None = None) -> None:
        self.base, self.environ, self.log = base, environ, log
        self.start = start  # the machine at the start, every GPU: a reload may move the spare
        # The spare's footprint as its first build of a configuration measured it (NVML),
        # keyed by what sizes it: later plans of that configuration use it for the estimate
        self.measured: dict[str, Footprint] = {}

    def measure(self, config: Config, footprint: Footprint) -> bool:
        """Keep the footprint a build of `config` measured; False when one is kept already
        (the first stays: a plan that moved with each rebuild's few MiB would move the
        serving engine's setting, and a running engine's setting cannot follow)."""
        return self.measured.setdefault(_sized_by(config), footprint) is footprint

    def plan(self, config: Config, quiet: bool = False) -> SparePlan:
        """The plan for `config`, logged as spare.plan unless `quiet`."""
        base = self.base if self.start is None else on_gpu(self.base, config, self.start)
        base = replace(base, measured=self.measured.get(_sized_by(config)))
        plan = plan_spare(config.spare, config.gate.enabled, flags_of(config),
                          model_facts(base, config, self.environ))
        if not quiet:
            self.log("info" if plan.on else "warning", "spare.plan", **plan.fields(),
                     lines=plan.lines(), uds=self.base.uds_path)
        return plan

    def command(self, config: Config, plan: SparePlan) -> SpareCommand:
        """The spare's command now: the key file is read again (a rotated key)."""
        from vllmwatch.shell.sparetree import SpareCommand

        cmd = command.build(config, self.environ, api_key=command.read_api_key(config))
        api_key = cmd.api_key  # the one it enforces, from any source (as the launch's)
        argv = _with_flags(cmd.argv, dict(plan.spare_flags))
        env = {**cmd.env, **plan.spare_env}
        # Its events, /status and output (vLLM prints its non-default args) hide these
        # values from the start: the spare is built before the first launch learns them.
        redact.learn([*launch.secrets_of(env, api_key), *cmd.hidden])
        return SpareCommand(argv, env, self.base.uds_path, config.vllm.model_name, api_key,
                            own_tmpdir="TMPDIR" not in config.vllm.env)


def _sized_by(config: Config) -> str:
    """What sizes the spare's footprint: the model, the serving command's flags (dtype,
    max-model-len, ...), its environment, [spare] and the GPUs."""
    v = config.vllm
    return json.dumps([v.model, v.command, v.env, flags_of(config), v.extra_args, v.gpus,
                       config.spare.kv_cache, config.spare.utilization], sort_keys=True,
                      default=str)


def make(config: Config, environ: Mapping[str, str], sampler: MemorySampler, unified: bool,
         log: LogFn, current: Callable[[], MemorySampler] | None = None,
         machine: MemorySample | None = None) -> SpareFx | None:
    """The plan, logged; a SpareFx when it is on. `sampler` measures the start; `machine`
    is every GPU at the start (a reload may move vLLM to a GPU the start's sampler does not
    watch: its re-plan reads that GPU's total there); `current` gives the sampler of the
    launch at hand (RealEffects makes a new one when a reload moves vLLM to other GPUs), so
    the wake's free memory and the spare's figure are read on the GPUs sampled now."""
    instance = instance_id(config.path)
    path = socket_path(environ, instance)
    if path is None:
        detail, todo = socket_problem(environ, instance)  # (named, never a traceback)
        log("warning", "spare.plan", on=False, reason="no private directory for the spare's "
            "Unix socket (its dev-mode endpoints must not be reachable by other users)",
            detail=detail, todo=todo)
        return None
    sample = sampler.sample(None, False, faults=False)  # the core's first sample reads them
    planner = Planner(facts(config, sample, unified, path, environ), environ, log,
                      machine or sample)
    plan = planner.plan(config)
    if not plan.on:
        return None
    from vllmwatch.shell.sparerun import SpareFx  # plan on only
    from vllmwatch.shell.sparetree import SpareTree

    # Its free memory on the GPU of the config its SpareFx runs now (set at each build and
    # launch; `fx` is bound below, before anything calls this)
    now = current or (lambda: sampler)
    tree = SpareTree(planner.command(config, plan), instance, log,
                     lambda pids: _gpu_of(now(), pids), lambda: free_mib(now(), fx.config),
                     forward=config.log.child_lines, listing=lambda pids: _listing(now(), pids))
    fx = SpareFx(config, plan, tree, log, planner=planner)
    return fx


def _gpu_of(sampler: MemorySampler, pids: set[int]) -> float | None:
    """The spare tree's GPU memory from NVML's per-process figures; None (unknown) when NVML
    lists none of its processes or gives one without its figure: a 0 there would pass the
    wake's room check with no room and under-count the release gate's spare."""
    return _listing(sampler, pids)[0]


def _listing(sampler: MemorySampler, pids: set[int]) -> tuple[float | None, bool]:
    """_gpu_of's figure, and whether NVML answered its process list at all: a failed call is
    no property of the host (SpareTree._unmeasured retries it), a list without us is."""
    procs = sampler.gpu_processes()
    if procs is None:
        return None, False
    mine = [p.used_mib for p in procs if p.pid in pids]
    if not mine or any(mib is None for mib in mine):
        return None, True
    return sum(mib for mib in mine if mib is not None), True


def free_mib(sampler: MemorySampler, config: Config) -> float | None:
    """NVML's free memory on the spare's GPU for `config` (None: not sampled, e.g. a GPU
    the sampler does not watch: the wake then says no, never an OOM). Without the GPU faults:
    taken here (the wake's check, right after an engine died of an Xid), the core's next
    sample would miss them, and a GPU fault would fail over instead of halting (exit 74)."""
    sample = sampler.sample(None, False, faults=False)
    gpu = spare_gpu(config.vllm.gpus, sample.device_total_mib)
    if gpu not in sample.device_total_mib or gpu not in sample.device_used_mib:
        return None
    return sample.device_total_mib[gpu] - sample.device_used_mib[gpu]
