"""StepTimer's summary as a table for logs and terminals: a label and a value a row."""

from __future__ import annotations

from typing import Any


def table(s: dict[str, Any]) -> str:
    """`s` (`StepTimer.summary`'s figures) as lines of `label  value`, no trailing newline."""

    def num(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 1e3:.2f} ms"

    rows = [
        ("steps timed", f"{s['steps']} ({s['excluded']} excluded)"),
        ("median step", ms(s["median_step_s"])),
        ("p90 step", ms(s["p90_step_s"])),
        ("total step time", f"{s['total_step_s']:.3f} s"),
        ("total data wait", f"{s['total_data_wait_s']:.3f} s"),
        (
            "total wall clock",
            f"{s['total_wall_s']:.3f} s ({s['total_other_s']:.3f} s outside step and data wait)",
        ),
        ("input-bound fraction", num(s["input_bound_fraction"], ".1%")),
        ("tokens/s, device time", num(s["device_tokens_per_s"], ",.0f")),
        ("tokens/s, step + data wait", num(s["step_and_wait_tokens_per_s"], ",.0f")),
        ("tokens/s, wall clock (whole loop)", num(s["wall_tokens_per_s"], ",.0f")),
        ("TFLOP/s/device, device time", num(s["tflops_per_device"], ".4g")),
        (
            "first step's data wait",
            num(s["first_data_wait_s"], ".3f") + " s"
            if s["first_data_wait_s"] is not None
            else "n/a",
        ),
        (
            "first step (compile)",
            num(s["first_step_s"], ".3f") + " s" if s["first_step_s"] is not None else "n/a",
        ),
    ]
    if "pod_processes" in s:
        rows += _pod_rows(s)
    if "pod_late_processes" in s:
        late = s["pod_late_processes"]
        rows.append(("pod", f"not gathered: processes {late} late for the first gather"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _pod_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's pod figures as table rows."""

    def pct(value: float | None) -> str:
        return "n/a" if value is None else format(value, ".1%")

    most = s["pod_most_often_worst"]
    first = s["pod_first_data_wait_s"]
    return [
        ("pod", f"{s['pod_processes']} processes, {s['pod_steps']} steps gathered"),
        ("pod data wait (worst host a step)", f"{s['pod_worst_data_wait_s']:.3f} s"),
        (
            "pod first batch wait (worst host)",
            f"{first:.3f} s (process {s['pod_first_process']})" if first is not None else "n/a",
        ),
        ("pod input-bound fraction (worst host)", pct(s["pod_input_bound_fraction"])),
        (
            "pod steps input-bound (>5% / >20%)",
            f"{pct(s['pod_input_bound_steps'])} / {pct(s['pod_highly_input_bound_steps'])}",
        ),
        (
            "pod's most often worst host",
            f"process {most['process']} ({most['steps']} input-bound steps)"
            if most
            else "none (no input-bound step)",
        ),
    ]
