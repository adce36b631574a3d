"""Plot the analysts' dashboard's core panels from a real Prometheus, for the README.

Grafana cannot be installed everywhere we build, so the README shows the data the
dashboard would show: the same queries (from dashboards/dp-monitor.json), run through
Prometheus's HTTP API and drawn with matplotlib.

    python deploy/grafana/render.py --prometheus http://127.0.0.1:9090 --minutes 15 \
        --out docs/figures/dashboard.png

The integration test (tests/test_prometheus_integration.py) uses the same functions
against the Prometheus it starts, and rewrites docs/figures/dashboard.png when
MONITOR_UPDATE_FIGURES=1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from dashboard import CORE_PANELS, OUT as DASHBOARD  # noqa: E402 - a script beside us, not a package

from monitor.docs import grafana_to_promql  # noqa: E402


# Series the dashboard draws dashed (its byName overrides with a line style).
DASHED = {o["matcher"]["options"] for p in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
          for o in p["fieldConfig"]["overrides"] if any(prop["id"] == "custom.lineStyle" for prop in o["properties"])}


def api(base: str, path: str, **params) -> dict:
    """GET a Prometheus API endpoint; raise with Prometheus's own error text on failure."""
    url = f"{base.rstrip('/')}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as err:  # 400/422 carry the PromQL error in the body
        body = json.load(err)
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def _legend(fmt: str, labels: dict) -> str:
    for key, value in labels.items():
        fmt = fmt.replace("{{" + key + "}}", value)
    return fmt or ",".join(f"{k}={v}" for k, v in labels.items() if k not in ("job", "instance"))


def core_series(base: str, start: float, end: float, step: float, rate_interval: str) -> dict[str, list]:
    """{panel title: [(legend, [t...], [v...]), ...]} for the core panels."""
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]}
    out: dict[str, list] = {}
    for title in CORE_PANELS:
        lines = out.setdefault(title, [])
        for target in panels[title]["targets"]:
            data = api(base, "query_range", query=grafana_to_promql(target["expr"], rate_interval), start=start, end=end, step=step)
            for series in data["result"]:
                ts = [float(t) - start for t, _ in series["values"]]
                vs = [float(v) for _, v in series["values"]]
                lines.append((_legend(target["legendFormat"], series["metric"]), ts, vs))
    return out


def plot(series: dict[str, list], out: Path, subtitle: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(12, 9), sharex=True)
    for ax, (title, lines) in zip(axes.flat, series.items()):
        for legend, ts, vs in lines:
            dashed = legend in DASHED  # drawn as in Grafana: a threshold or a baseline, not data
            ax.plot(ts, vs, label=legend, linestyle="--" if dashed else "-")
        ax.set_title(title, fontsize=10)
        if lines:
            ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("seconds")
    fig.suptitle("DP outlier monitor: core panels of the analysts' dashboard, queried from Prometheus" + (f"\n{subtitle}" if subtitle else ""), fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=15.0, help="time range ending now")
    parser.add_argument("--step", type=float, default=5.0, help="seconds between points")
    parser.add_argument("--rate-interval", default="1m", help="value for Grafana's $__rate_interval")
    parser.add_argument("--out", type=Path, default=HERE.parent.parent / "docs" / "figures" / "dashboard.png")
    args = parser.parse_args(argv)
    end = time.time()
    plot(core_series(args.prometheus, end - 60 * args.minutes, end, args.step, args.rate_interval), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
