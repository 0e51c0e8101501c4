"""Container runtime checks: docker/podman info, nvidia-ctk, CDI and image parsers (pure) and their checks."""
from __future__ import annotations

import json
import re
import shlex
from typing import TYPE_CHECKING, Any

from clusterctl.checks.gpu import parse_nvidia_smi, parse_nvidia_smi_list
from clusterctl.checks.job import DEFAULT_IMAGE, PreflightJob, PreflightOptions
from clusterctl.checks.model import (
    Check,
    HostProbe,
    Probe,
    Section,
    first_line,
    has_gpus,
    section,
    tool_cmd,
    tool_error,
)
from clusterctl.checks.results import CheckResult, failed, passed, skipped, warned
from clusterctl.launch import runtimes

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host

IMAGE_FORMAT = "{{.Id}} {{json .RepoDigests}}"
# the container engines' `info` (each runtime says its own; bare has none)
RUNTIME_INFO_ARGV = {n: rt.info_argv for n in runtimes.names() if (rt := runtimes.get(n)).info_argv}

TOOLKIT_INSTALL_HINT = ("install nvidia-container-toolkit "
                        "(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html)")
DOCKER_CONFIGURE = "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker"
CDI_GENERATE = "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
DOCKER_CDI = ('or, with docker >= 25, set `"features": {"cdi": true}` in /etc/docker/daemon.json, restart docker '
              f"and `{CDI_GENERATE}`")
# How a container gets the host's GPUs (``runtimes.RunRequest.gpu_flags``): the ``nvidia`` docker runtime/hook
# (``--gpus=all``), or a CDI spec (``--device=nvidia.com/gpu=all``: podman; docker >= 25 with CDI enabled).
GPU_FLAGS_GPUS = "gpus"
GPU_FLAGS_CDI = "cdi"
_DECODER = json.JSONDecoder()


def _json_and_messages(output: str) -> tuple[Any, list[str]]:
    """The first JSON object in ``output`` and the non-empty lines outside it (stderr noise, errors)."""
    start = output.find("{")
    doc, end = None, start
    if start >= 0:
        try:
            doc, end = _DECODER.raw_decode(output, start)
        except ValueError:
            doc, end = None, start
    rest = output if doc is None else output[:start] + "\n" + output[end:]
    return doc, [ln.strip() for ln in rest.splitlines() if ln.strip()]


def parse_runtime_info(output: str, rc: int = 0) -> dict[str, Any]:
    """``docker info --format '{{json .}}'`` or ``podman info --format json`` (also podman behind a ``docker``
    shim) -> {"flavor", "version", "runtimes", "root", "rootless", "error"}."""
    doc, messages = _json_and_messages(output)
    out: dict[str, Any] = {"flavor": None, "version": None, "runtimes": [], "root": None, "rootless": None,
                           "error": None, "cdi": False}
    if isinstance(doc, dict) and "store" in doc and "host" in doc:          # podman
        out.update(flavor="podman", version=(doc.get("version") or {}).get("Version"),
                   runtimes=[r for r in [((doc["host"].get("ociRuntime") or {}).get("name"))] if r],
                   root=(doc.get("store") or {}).get("graphRoot"),
                   rootless=(doc["host"].get("security") or {}).get("rootless"))
    elif isinstance(doc, dict):                                              # docker
        out.update(flavor="docker", version=doc.get("ServerVersion") or None,
                   runtimes=sorted(doc.get("Runtimes") or {}), root=doc.get("DockerRootDir") or None,
                   # docker >= 25 lists CDISpecDirs only while CDI is enabled (the "cdi" feature)
                   cdi=bool(doc.get("CDISpecDirs")) and _major(doc.get("ServerVersion")) >= 25)
        server_errors = doc.get("ServerErrors") or []
        if server_errors or not out["version"]:
            out["error"] = (server_errors[0] if server_errors else None) or _pick_error(messages) or \
                "docker daemon did not answer"
    if rc != 0 and not out["error"]:
        out["error"] = _pick_error(messages) or f"exit {rc}"
    if doc is None and not out["error"]:
        out["error"] = _pick_error(messages) or "no output"
    return out


def _major(version: Any) -> int:
    m = re.match(r"(\d+)\.", str(version or ""))
    return int(m.group(1)) if m else 0


def choose_gpu_flags(info: dict[str, Any], cdi_gpus: int, hook: bool = False) -> str | None:
    """How this host's containers get GPUs, from the configuration alone (pure; the GPU container run, where it
    ran, overrides it): ``"gpus"`` where docker has the ``nvidia`` runtime registered or the
    ``nvidia-container-runtime-hook`` is on the PATH (dockerd registers its ``gpu`` device driver whenever the hook
    is on its PATH at start: moby ``daemon/nvidia_linux.go``), ``"cdi"`` where a CDI spec lists GPUs and the
    runtime reads it (podman; docker >= 25 with CDI enabled), None where neither is set up."""
    if info.get("flavor") == "docker":
        if hook or "nvidia" in (info.get("runtimes") or []):
            return GPU_FLAGS_GPUS
        return GPU_FLAGS_CDI if info.get("cdi") and cdi_gpus else None
    return GPU_FLAGS_CDI if cdi_gpus else None


def _pick_error(messages: list[str]) -> str | None:
    for m in messages:
        if m.startswith(("Error", "ERROR")):
            return m[:300]
    for m in messages:
        if re.search(r"error|cannot|permission|denied|failed|not found", m, re.I):
            return m[:300]
    return messages[0][:300] if messages else None


def parse_nvidia_ctk_version(output: str, rc: int = 0) -> dict[str, Any]:
    """``nvidia-ctk --version`` -> {"version": "1.14.6" | None}."""
    m = re.search(r"version\s+v?(\d+(?:\.\d+)+)", output) if rc == 0 else None
    return {"version": m.group(1) if m else None}


_CDI_RE = re.compile(r"^([A-Za-z0-9][\w.-]*/[\w.-]+)=(\S+)$")


def parse_cdi_list(output: str, rc: int = 0) -> dict[str, Any]:
    """``nvidia-ctk cdi list`` (logrus INFO line + one device per line) -> {"devices", "gpus"} where ``gpus``
    counts the ``nvidia.com/gpu=<index>`` entries."""
    devices = []
    for line in output.splitlines():
        m = _CDI_RE.match(line.strip())
        if m:
            devices.append(m.group(0))
    gpus = sum(1 for d in devices if re.fullmatch(r"nvidia\.com/gpu=\d+", d))
    return {"devices": devices, "gpus": gpus}


def parse_image_inspect(output: str, rc: int = 0) -> dict[str, Any]:
    """``<rt> image inspect --format '{{.Id}} {{json .RepoDigests}}' IMAGE`` -> {"present", "id", "digest",
    "error"}. ``digest``: the first repo digest (``sha256:...``), else the image id."""
    if rc != 0:
        return {"present": False, "id": None, "digest": None, "error": first_line(output) or f"exit {rc}"}
    for line in output.splitlines():
        parts = line.strip().split(" ", 1)
        if parts[0].startswith("sha256:") or re.fullmatch(r"[0-9a-f]{64}", parts[0]):
            image_id = parts[0] if parts[0].startswith("sha256:") else "sha256:" + parts[0]
            try:
                repo_digests = json.loads(parts[1]) if len(parts) > 1 else []
            except ValueError:
                repo_digests = []
            if not isinstance(repo_digests, list):       # a node's output is not trusted to be well-formed
                repo_digests = []
            digest = next((d.split("@", 1)[1] for d in repo_digests if isinstance(d, str) and "@" in d), image_id)
            return {"present": True, "id": image_id, "digest": digest, "error": None}
    return {"present": False, "id": None, "digest": None, "error": first_line(output) or "no image id"}


_ATTEMPT_RE = re.compile(r"^> (\w+)$")
_USAGE_RE = re.compile(r"^Run '\S+ \w+ --help' for more information$")
_IMAGE_MISSING = ("no such image", "unable to find image", "image not known", "pull access denied")


def parse_gpu_run(output: str, rc: int = 0) -> dict[str, Any]:
    """The GPU container run (``gpu_run``): per attempt a ``> FLAGS`` line, then ``<rt> run --rm ... --entrypoint=
    nvidia-smi FLAGS IMAGE -L``'s output; an attempt follows only where the one before failed, so only the last
    can have succeeded (``rc`` is its exit code) -> {"flags": the flags that showed GPUs | None, "gpus": how many
    the container saw, "attempts": [{"flags", "error"}], "image_missing": the image was not there to run}."""
    attempts: list[tuple[str, list[str]]] = []
    for line in output.splitlines():
        m = _ATTEMPT_RE.match(line.strip())
        if m:
            attempts.append((m.group(1), []))
        elif attempts:
            attempts[-1][1].append(line)
    out: dict[str, Any] = {"flags": None, "gpus": 0, "attempts": [], "image_missing": False}
    for i, (flags, lines) in enumerate(attempts):
        last = i == len(attempts) - 1
        listed = parse_nvidia_smi_list("\n".join(lines), rc if last else 1)
        if last and listed["gpus"]:
            out.update(flags=flags, gpus=len(listed["gpus"]))
            break
        text = " ".join(ln.strip() for ln in lines if ln.strip() and not _USAGE_RE.match(ln.strip()))
        error = ("timed out" if last and rc == 124 else None) or text[:500] or f"exit {rc if last else 1}"
        out["attempts"].append({"flags": flags, "error": error})
        out["image_missing"] = out["image_missing"] or any(m in text.lower() for m in _IMAGE_MISSING)
    return out


def runtime_info(p: HostProbe) -> dict[str, Any] | None:
    sec = p.sections.get("runtime_info")
    return parse_runtime_info(sec.output, sec.rc) if sec is not None else None


def _runtime_hint(rt: str, error: str, sec: Section | None) -> str:
    e = error.lower()
    if sec is not None and sec.rc == 127 or "not found" in e:
        return f"install {rt} on the host, or set clusterctl_runtime (docker | podman | bare) for it"
    if "permission denied" in e:
        return "add the user to the docker group: `sudo usermod -aG docker $USER`, then log in again" \
            if rt == "docker" else f"run `{rt} info` as this user and fix the permission error"
    if "cannot connect" in e or "is the docker daemon running" in e:
        return "start the daemon: `sudo systemctl enable --now docker`"
    return f"run `{rt} info` on the host and fix the error it prints"


def check_container_runtime(p: HostProbe) -> CheckResult:
    rt = p.host.runtime
    if not runtimes.containerized(rt):
        return skipped("container_runtime", f"{rt} runtime (no container)")
    info = runtime_info(p)
    sec = p.sections.get("runtime_info")
    if info is None or info["error"]:
        err = (tool_error(rt, sec, p.options.probe_timeout_s) if sec is not None and sec.rc in (124, 127) else
               None) or (f"{rt} info: {info['error']}" if info else f"{rt} info did not run")
        return failed("container_runtime", err, _runtime_hint(rt, err, sec), runtime=rt)
    flavor = info["flavor"]
    via = " (podman behind the docker command)" if rt == "docker" and flavor == "podman" else ""
    return passed("container_runtime", f"{flavor} {info['version']}{via}", runtime=rt, flavor=flavor,
                  version=info["version"], root=info["root"], rootless=info["rootless"])


def gpu_run_argv(rt: str, image: str, flags: str) -> tuple[str, ...]:
    """One bounded container that proves hook (or CDI spec), driver libraries and devices together: ``nvidia-smi
    -L`` inside the job's image, with the GPU flags a launch would pass (``NVIDIA_DRIVER_CAPABILITIES``: the
    hook mounts nvidia-smi with ``utility`` and the CUDA libraries with ``compute``)."""
    return (rt, "run", "--rm", "--pull=never", "--network=none", "--entrypoint=nvidia-smi",
            "--env=NVIDIA_DRIVER_CAPABILITIES=compute,utility", *runtimes.get(rt).gpu_args(flags), "--", image, "-L")


def gpu_flag_choices(rt: str) -> tuple[str, ...]:
    """The ways this runtime can hand a container GPUs, in the order a launch prefers them (docker: the hook's
    ``--gpus``, then CDI; podman: CDI only)."""
    out: dict[tuple[str, ...], str] = {}
    for flags in (GPU_FLAGS_GPUS, GPU_FLAGS_CDI):
        out.setdefault(tuple(runtimes.get(rt).gpu_args(flags)), flags)
    return tuple(out.values())


def _flag_text(flags: str) -> str:
    return "--gpus=all" if flags == GPU_FLAGS_GPUS else "CDI (--device=nvidia.com/gpu=all)"


def _gpu_run_hint(error: str, rt: str, image: str) -> str:
    e = error.lower()
    if "could not select device driver" in e:
        return ("dockerd registers `--gpus` only when nvidia-container-runtime-hook is on its PATH when it starts: "
                f"{TOOLKIT_INSTALL_HINT}, then `sudo systemctl restart docker`; {DOCKER_CDI}")
    if "version mismatch" in e:
        return "the loaded kernel module and the installed NVIDIA libraries differ: reboot the host (or reload the nvidia modules)"
    if "driver not loaded" in e or "nvml error" in e:
        return "the NVIDIA kernel driver is not usable: `sudo modprobe nvidia` (check `nvidia-smi` on the host)"
    if "unresolvable cdi devices" in e or "cdi" in e and "no such" in e:
        return CDI_GENERATE
    if "executable file not found" in e or "no such file or directory" in e and "nvidia-smi" in e:
        return ("the GPU hook mounted no driver tools into the container: check `nvidia-container-cli info` on the "
                "host and that the image does not set NVIDIA_DRIVER_CAPABILITIES without `utility`")
    cmd = shlex.join(gpu_run_argv(rt, image, GPU_FLAGS_GPUS))
    return f"run `{cmd}` on the host and fix the error it prints"


def check_nvidia_toolkit(p: HostProbe) -> CheckResult:
    rt = p.host.runtime
    if p.host.gpus == 0:
        return skipped("nvidia_toolkit", "CPU host (clusterctl_gpus: 0)")
    if not runtimes.containerized(rt):
        return skipped("nvidia_toolkit", f"{rt} runtime (no container)")
    sec = p.sections.get("nvidia_ctk")
    version = parse_nvidia_ctk_version(sec.output, sec.rc)["version"] if sec else None
    info = runtime_info(p)
    if version is None and (info is None or info["error"] or p.sections.get("gpu_run") is None):
        err = tool_error("nvidia-ctk", sec, p.options.probe_timeout_s) or "nvidia-ctk printed no version"
        return failed("nvidia_toolkit", f"nvidia-container-toolkit: {err}", TOOLKIT_INSTALL_HINT)
    if info is None or info["error"]:
        return skipped("nvidia_toolkit", f"nvidia-ctk {version}; runtime unusable (see container_runtime)",
                       version=version)
    smi = p.sections.get("nvidia_smi")
    host_gpus = (len(parse_nvidia_smi(smi.output, smi.rc)["gpus"]) if smi is not None else 0) or p.host.gpus or 0
    run_sec = p.sections.get("gpu_run")
    run = parse_gpu_run(run_sec.output, run_sec.rc) if run_sec is not None else None
    if run is not None and run["flags"]:
        # the container run is the proof: hook (or CDI spec), libraries and devices together
        n, how = run["gpus"], _flag_text(run["flags"])
        data = {"version": version, "runtimes": info["runtimes"], "gpu_flags": run["flags"], "container_gpus": n,
                "host_gpus": host_gpus}
        if host_gpus and n < host_gpus:
            return failed("nvidia_toolkit", f"a container started with {how} sees {n} of the host's {host_gpus} "
                          "GPUs", f"check NVIDIA_VISIBLE_DEVICES in the image and `{CDI_GENERATE}` (a stale CDI "
                          "spec lists fewer GPUs)", **data)
        tool = f"nvidia-ctk {version}; " if version else ""
        return passed("nvidia_toolkit", f"{tool}a container started with {how} sees {n} GPUs", **data)
    if version is None:
        err = tool_error("nvidia-ctk", sec, p.options.probe_timeout_s) or "nvidia-ctk printed no version"
        return failed("nvidia_toolkit", f"nvidia-container-toolkit: {err}", TOOLKIT_INSTALL_HINT)
    cdi_sec = p.sections.get("cdi_list")
    cdi = parse_cdi_list(cdi_sec.output, cdi_sec.rc) if cdi_sec else {"devices": [], "gpus": 0}
    hook_sec = p.sections.get("nvidia_hook")
    hook = hook_sec is not None and hook_sec.rc == 0 and bool(hook_sec.output.strip())
    flags = choose_gpu_flags(info, cdi["gpus"], hook)
    data = {"version": version, "runtimes": info["runtimes"], "cdi_gpus": cdi["gpus"], "gpu_flags": flags}
    if run is not None and run["attempts"] and not run["image_missing"]:
        # the container run failed for a reason of its own: that is the verdict, whatever the configuration says
        detail = "; ".join(f"{_flag_text(a['flags'])}: {a['error']}" for a in run["attempts"])
        return failed("nvidia_toolkit", f"a GPU container does not start: {detail}",
                      _gpu_run_hint(run["attempts"][0]["error"], rt, p.image), **dict(data, gpu_flags=None))
    unproven = " (not proven: the image is not on the host to run)" if run is not None else ""
    if info["flavor"] == "docker":
        if flags is None:
            cdi_state = ("CDI enabled but `nvidia-ctk cdi list` lists no GPUs" if info.get("cdi") else
                         "CDI not enabled")
            return failed("nvidia_toolkit", f"nvidia-ctk {version} installed but docker has no `nvidia` runtime "
                          f"(runtimes: {', '.join(info['runtimes']) or 'none'}), no nvidia-container-runtime-hook "
                          f"on the PATH and {cdi_state}",
                          f"{DOCKER_CONFIGURE} (for --gpus=all), {DOCKER_CDI}", **data)
        if flags == GPU_FLAGS_GPUS:
            way = "runtime `nvidia` configured" if "nvidia" in (info["runtimes"] or []) else \
                "nvidia-container-runtime-hook on the PATH"
            return passed("nvidia_toolkit", f"nvidia-ctk {version}; docker {way} (--gpus=all){unproven}", **data)
        return passed("nvidia_toolkit", f"nvidia-ctk {version}; docker CDI, {cdi['gpus']} GPU devices "
                      f"(--device=nvidia.com/gpu=all){unproven}", **data)
    if not cdi["gpus"]:
        return failed("nvidia_toolkit", f"nvidia-ctk {version} installed but no CDI GPU devices "
                      "(`nvidia-ctk cdi list` lists none)", CDI_GENERATE, **data)
    n = p.host.gpus
    if n is not None and cdi["gpus"] < n:
        return warned("nvidia_toolkit", f"CDI spec lists {cdi['gpus']} GPUs, host has {n} (stale spec?)",
                      CDI_GENERATE, **data)
    return passed("nvidia_toolkit", f"nvidia-ctk {version}; {cdi['gpus']} CDI GPU devices", **data)


def check_image(p: HostProbe) -> CheckResult:
    rt = p.host.runtime
    image = p.image
    if not runtimes.containerized(rt):
        return skipped("image", f"{rt} runtime (no container)")
    info = runtime_info(p)
    if info is None or info["error"]:
        return skipped("image", "runtime unusable (see container_runtime)", image=image)
    pull = p.sections.get("image_pull")
    if pull is not None and pull.rc != 0:
        err = tool_error(f"{rt} pull", pull, p.options.pull_timeout_s) or "pull failed"
        return failed("image", f"{image}: {err}", f"check the image name and registry access on the host "
                      f"(`{rt} login REGISTRY`)", image=image)
    sec = p.sections.get("image")
    parsed = parse_image_inspect(sec.output, sec.rc) if sec else None
    if parsed is None or not parsed["present"]:
        return failed("image", f"{image} is not present on the host",
                      f"`{rt} pull {shlex.quote(image)}` on the host, or rerun preflight with --pull", image=image)
    short = parsed["digest"].split(":")[-1][:12]
    return passed("image", f"{image} ({short})", image=image, id=parsed["id"], digest=parsed["digest"])


# ------------------------------------------------------------------------------------------------ probes, checks
def in_container(host: "Host", job: PreflightJob | None, o: PreflightOptions) -> bool:
    """The host runs the job in a container runtime this module can query (not bare)."""
    return host.runtime in RUNTIME_INFO_ARGV


def _info_snippet(host: "Host", job: PreflightJob | None, o: PreflightOptions) -> str:
    """Also keeps the output in ``$ri`` for ``df_runtime`` (the container storage root)."""
    return (f"b runtime_info; ri=$({tool_cmd(o.probe_timeout_s, RUNTIME_INFO_ARGV[host.runtime])}); rc=$?; "
            "printf '%s' \"$ri\"; e runtime_info $rc\n")


def _image_snippet(host: "Host", job: PreflightJob | None, o: PreflightOptions) -> str:
    rt, image = host.runtime, (job.image if job else None) or DEFAULT_IMAGE
    pull = section("image_pull", tool_cmd(o.pull_timeout_s, (rt, "pull", "-q", "--", image))) if o.pull else ""
    return pull + section("image", tool_cmd(o.probe_timeout_s, (rt, "image", "inspect", "--format", IMAGE_FORMAT,
                                                                 "--", image)))


def _gpu_container(host: "Host", job: PreflightJob | None, o: PreflightOptions) -> bool:
    return has_gpus(host, job, o) and in_container(host, job, o)


def _gpu_choice(host: "Host", job: PreflightJob | None, o: PreflightOptions) -> bool:
    """A GPU host whose runtime has more than one way to hand a container GPUs (docker): a container run tells
    which one works. (podman reads only the CDI spec, which ``cdi_list`` lists.)"""
    return _gpu_container(host, job, o) and len(gpu_flag_choices(host.runtime)) > 1


def _gpu_run_snippet(host: "Host", job: PreflightJob | None, o: PreflightOptions) -> str:
    image = (job.image if job else None) or DEFAULT_IMAGE
    attempts = [f"{{ echo '> {f}'; {tool_cmd(o.probe_timeout_s, gpu_run_argv(host.runtime, image, f))}; }}"
                for f in gpu_flag_choices(host.runtime)]
    return section("gpu_run", " || ".join(attempts))


INFO = Probe("runtime_info", _info_snippet, applies=in_container)
NVIDIA_HOOK = Probe("nvidia_hook", lambda host, job, o: section(
    "nvidia_hook", "command -v nvidia-container-runtime-hook"), applies=_gpu_choice)
GPU_RUN = Probe("gpu_run", _gpu_run_snippet, applies=_gpu_choice)
NVIDIA_CTK = Probe("nvidia_ctk", lambda host, job, o: section(
    "nvidia_ctk", tool_cmd(o.probe_timeout_s, ("nvidia-ctk", "--version"))), applies=_gpu_container)
CDI_LIST = Probe("cdi_list", lambda host, job, o: section(
    "cdi_list", tool_cmd(o.probe_timeout_s, ("nvidia-ctk", "cdi", "list"))), applies=_gpu_container)
IMAGE_PROBE = Probe("image", _image_snippet, applies=in_container)

RUNTIME = Check("container_runtime", "host", check_container_runtime, ("runtime_info",), label="runtime",
                launch=True)
TOOLKIT = Check("nvidia_toolkit", "host", check_nvidia_toolkit, ("runtime_info", "nvidia_ctk", "cdi_list",
                                                                  "nvidia_hook", "gpu_run"),
                label="toolkit", launch=True)
IMAGE = Check("image", "host", check_image, ("runtime_info", "image"), label="image", launch=True)
