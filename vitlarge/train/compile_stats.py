"""What ``torch.compile`` did in this process: graphs, graph breaks and recompiles, with their first reasons.

A graph break splits the model's forward into several graphs (each boundary a trip through Python and lost
fusion); a recompile is a second graph for the same frame because a guard failed (a new input shape: each
phase's image size and batch, eval's batch). Both are normal in small numbers (`vitlarge.train.assemble.
recompile_limit` sizes the limit to the phases) and a performance bug in large ones, so a compiled run logs
them after its first step and at its end (`vitlarge.train.loop`), and the GPU tier and the compile tests
read the same counts.

Read from Dynamo's own records: ``counters["graph_break"]`` (one entry per reason, counted per compile),
``counters["stats"]["unique_graphs"]`` and the compilation metrics (`torch._dynamo.utils.get_compilation_metrics`:
one record per frame compile, keeping the last 64, with the guard that failed in ``recompile_reason``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch._dynamo.utils import counters, get_compilation_metrics


@dataclass(frozen=True)
class CompileStats:
    graphs: int
    graph_breaks: int
    recompiles: int
    break_reasons: list[str] = field(default_factory=list)
    recompile_reasons: list[str] = field(default_factory=list)

    def line(self) -> str:
        """``compile: 3 graphs, 0 graph breaks, 2 recompiles (first: <guard>)``: one line for the console."""
        text = f"compile: {self.graphs} graphs, {self.graph_breaks} graph breaks, {self.recompiles} recompiles"
        notes = []
        if self.break_reasons:
            notes.append(f"first break: {self.break_reasons[0]}")
        if self.recompile_reasons:
            notes.append(f"first recompile: {self.recompile_reasons[0]}")
        return text + (f" ({'; '.join(notes)})" if notes else "")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:160] if text and text.strip() else "?"


def compile_stats() -> CompileStats:
    """The counts so far in this process (cumulative; Dynamo's counters are process-wide)."""
    breaks = counters["graph_break"]
    recompiles = [m.recompile_reason for m in get_compilation_metrics() if m.recompile_reason]
    return CompileStats(
        graphs=int(counters["stats"]["unique_graphs"]),
        graph_breaks=int(sum(breaks.values())),
        recompiles=len(recompiles),
        break_reasons=[_first_line(r) for r in breaks],
        recompile_reasons=[_first_line(r) for r in recompiles],
    )
