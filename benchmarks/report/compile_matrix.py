"""docs/PERFORMANCE.md's table of compiled combinations, from benchmarks/results/compile_matrix.json.

Contract: `table(d)` takes the benchmark's result (`benchmarks.bench_compile_matrix.run`) and returns
Markdown lines: one row per combination, a row that failed says so with its error's first line.
"""

from __future__ import annotations


def _yes(ok) -> str:
    return "yes" if ok else "**no**"


def _counts(c: dict | None) -> str:
    return "n/a" if not c else f"{c['graphs']} / {c['graph_breaks']} / {c['recompiles']}"


def _reasons(c: dict | None) -> str:
    if not c:
        return ""
    parts = [f"break: {c['first_break']}" if c.get("first_break") else "", ""]
    if c.get("first_recompile"):
        parts[1] = f"recompile: {c['first_recompile']}"
    return "; ".join(p for p in parts if p).replace("|", "\\|") or "none"


def row(r: dict) -> str:
    if "error" in r:
        first = r["error"].strip().splitlines()[0][:200].replace("|", "\\|")
        return f"| {r['name']} | {r['steps']} | **failed**: {first} | | | | | | |"
    a = r["loss_agreement"]
    resume = f"{_yes(r['resume_bitwise'])} (killed after {r['killed_after_step']}, resumed at {r['resumed_at']})"
    return (
        f"| {r['name']} | {r['steps']} | {_yes(r['trains'])} | {resume} | "
        f"{a['max_abs']:.1e} ({_yes(r['loss_within_tolerance'])}, <= {r['tolerance']:g}) | "
        f"{_counts(r['compile_after_step_1'])} | {_counts(r['compile_at_end'])} | {_reasons(r['compile_at_end'])} | "
        f"{r['compiled_vs_eager_time']:.2f}x ({r['eager_step_s'] * 1000:.0f} ms eager) |"
    )


def table(d: dict) -> list[str]:
    m = d.get("machine", {})
    head = [
        f"`benchmarks/bench_compile_matrix.py` (not in the quick suite; {d['wall_s'] / 60:.0f} min): `{d['recipe']}` with "
        f"`model.kwargs={d['model_kwargs']}`, `{d['batch']}` (accumulation 2), {d['processes']} processes over gloo "
        f"(torchrun), data {d['data']}, `train.deterministic=true`, on "
        f"{m.get('cpu', '?')} ({m.get('os_cpus', '?')} cores, shared), torch {m.get('torch', '?')}. Per combination: eager, "
        "compiled (the reference), compiled killed with SIGKILL after its mid-run checkpoint and rerun. "
        "*Resumes bitwise*: every loss after the resume and the exported weights equal the reference's bit for bit. "
        "*Loss vs eager*: the largest |compiled - eager| train loss over the run, against the stated tolerance. "
        "Graphs / graph breaks / recompiles: the compiled run's own `compile:` log lines, after step 1 and at the end "
        f"(which counts the final evaluation). Step time: medians after the first {d['warm_steps_excluded']} steps.\n",
        "| combination | steps | trains | resumes bitwise after kill -9 | max \\|loss - eager\\| (within) | "
        "graphs / breaks / recompiles after step 1 | at the end | first reasons (end) | step time compiled / eager (< 1: compiled faster) |",
        "|---|---:|---|---|---|---|---|---|---:|",
    ]
    return head + [row(r) for r in d["rows"]] + [""] + measured_on(d["rows"])


def measured_on(rows: list[dict]) -> list[str]:
    """When the rows were measured, where a partial run (``--only``) kept earlier ones: step times from different
    days saw different loads, so compare each row's compiled / eager ratio, not its milliseconds across days."""
    days: dict[str, list[str]] = {}
    for r in rows:
        days.setdefault(r.get("measured_at", "?"), []).append(r["name"])
    if len(days) < 2:
        return []
    parts = [f"{day}: {len(names)} ({', '.join(names[:1])} ... {names[-1]})" for day, names in sorted(days.items())]
    return [
        f"Rows measured on {'; '.join(parts)}. Each day's load differed (other jobs on the 2 cores): compare a row's "
        "compiled / eager ratio, not milliseconds across days.\n"
    ]
