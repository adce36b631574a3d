"""The monitor's configuration: one pydantic model, loaded once at start.

Every setting has a default that works on a fresh machine; a bad value stops the
program before it touches any data, with the dotted path of the bad key.

>>> cfg = MonitorConfig.model_validate({"features": [{"name": "hr", "min": 30, "max": 220}]})
>>> cfg.window.size_seconds
300.0
>>> cfg.feature_names
['hr']
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from monitor.errors import ConfigError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "ConfigError",
    "Feature",
    "ModelSettings",
    "StreamSettings",
    "WindowSettings",
    "ReportSettings",
    "AlarmSettings",
    "ADVANCED_ALARM_KEYS",
    "BudgetSettings",
    "MetricsSettings",
    "MonitorConfig",
    "load_config",
]


class _Strict(BaseModel):
    # A typo in a key must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Feature(_Strict):
    """One numeric feature of an event, with its PUBLIC bounds.

    The bounds are used to scale the feature to [0, 1] (values outside are clipped).
    They must come from domain knowledge, never from the data: scaling by the data's
    own range would leak it (docs/design.md#the-model).
    """

    name: str = Field(min_length=1, description="JSON field of the event that holds this feature.")
    min: float = Field(description="Public lower bound; smaller values are clipped to it.")
    max: float = Field(description="Public upper bound; larger values are clipped to it.")

    @model_validator(mode="after")
    def _ordered(self) -> "Feature":
        if not (math.isfinite(self.min) and math.isfinite(self.max)):
            raise ValueError("min and max must be finite numbers")
        if self.max <= self.min:
            raise ValueError(f"max ({self.max}) must be greater than min ({self.min})")
        return self


class ModelSettings(_Strict):
    """The private grid-kNN model (docs/design.md#the-model) that scores every event."""

    path: Path = Field(Path("model.json"), description="Model file written by `monitor fit` and read by `monitor run`.")
    epsilon: float = Field(1.0, gt=0, description="Privacy budget of the fit, charged to the reference ledger.")
    bins: int | None = Field(None, ge=2, description="Bins per dimension of the joint grids; null chooses from the number of features, epsilon and a noisy count of the reference records (docs/model.md).")
    k: int | None = Field(None, ge=1, description="Neighbours (noisy mass) for the kNN score; null chooses from the number of grids, epsilon and the noisy record count.")
    max_depth: int | None = Field(None, ge=0, description="How many cell rings to search; null chooses.")
    weighted: bool = Field(False, description="Weighted kNN score (count-weighted distances) instead of the basic one.")
    contamination: float | None = Field(0.05, gt=0, lt=0.5, description="Share of normal events to flag: the threshold is the calibrated (1 - contamination) quantile of the scores of reference rows held apart from the grids (docs/model.md); `monitor fit` says when too few rows are held apart for it.")
    calibration_share: float = Field(0.25, ge=0, le=0.9, description="Share of the reference rows held apart from the grids to calibrate rates (contamination, the alarm's levels): disjoint rows, so no extra epsilon (parallel composition). 0 = uncalibrated rates (quantiles of the model's own noisy mass).")
    threshold: float | None = Field(None, description="Explicit score threshold; overrides contamination.")
    score_power: float = Field(1.5, ge=1, le=8, description="p of the power mean over the grids' scores that makes an event's score, (mean of s^p)^(1/p): 1 the plain mean, above 1 an event far out in one grid outranks one a little out in every grid (docs/model.md#the-tail-rule-and-why-it-is-the-default).")
    layout_rule: Literal["tail", "v4"] = Field("tail", description="How the grids are laid out from the noisy record count: \"tail\" (resolution where the alarm's top 1 % to 10 % of scores lie) or \"v4\", the rule before it (chosen for AUROC; docs/model.md#the-tail-rule-and-why-it-is-the-default).")


class StreamSettings(_Strict):
    """Kafka topics and client settings."""

    bootstrap_servers: str | list[str] | None = Field(
        None, description="Kafka brokers; null starts an embedded Tansu broker on 127.0.0.1."
    )
    input_topic: str = Field("events", min_length=1, description="Topic of JSON events to monitor.")
    alerts_topic: str = Field("monitor.alerts", min_length=1, description="Topic receiving one JSON record per released window.")
    dead_letter_topic: str = Field("monitor.dead-letter", min_length=1, description="Topic receiving malformed events with their reason.")
    scores_topic: str | None = Field(None, description="Optional per-event score topic (inside the trust boundary only); null = off.")
    group_id: str = Field("dp-outlier-monitor", min_length=1, description="Kafka consumer group.")
    timestamp_field: str | None = Field("ts", description="Event-time field (epoch seconds or ISO 8601); null uses the Kafka record timestamp.")
    entity_field: str | None = Field(None, description="Privacy unit field; at most one event per entity per window is kept.")
    max_message_bytes: int = Field(65536, gt=0, description="Larger messages go to the dead-letter topic.")
    kafka: dict[str, Any] = Field(default_factory=dict, description="Extra kafka-python settings passed through (SASL, TLS, ...).")
    embedded_broker_port: int = Field(0, ge=0, le=65535, description="Port of the embedded broker; 0: Kafka's 9092 when it is free, else a free one (the start-up line names it).")
    connect_timeout_seconds: float = Field(
        5.0, gt=0, description="How long `monitor run` waits at start for a bootstrap server to accept a connection before it "
        "stops with one line (exit 2)."
    )
    input_backend: Literal["kafka-python", "confluent"] = Field(
        "kafka-python",
        description="Client stage 1 reads the input with: confluent-kafka (librdkafka, extra `confluent`) reads faster.",
    )
    confluent: dict[str, Any] = Field(
        default_factory=dict, description="librdkafka settings for the confluent input backend (security.protocol, ...).",
    )
    stage: Literal["both", "1", "2"] = Field(
        "both",
        description="What this process runs (docs/scaling.md): both stages, or stage 1 only (validate, score, window; "
        "many processes) or stage 2 only (merge, release; one process). `monitor run --stage` overrides it.",
    )
    internal_topic: str | None = Field(
        None, min_length=1,
        description="Topic from stage 1 to stage 2: per window and input partition, the kept events' raw features "
        "(inside the trust boundary, like the input); null = `<group_id>.shards`.",
    )

    @property
    def shard_topic(self) -> str:
        """The internal topic: ``internal_topic``, or one per consumer group."""
        return self.internal_topic or f"{self.group_id}.shards"


class WindowSettings(_Strict):
    """Tumbling event-time windows."""

    publish_delay_seconds: float = Field(
        5.0, ge=0, description="Each window's alert is stamped and published this long after the window's close time, "
        "whatever the window held, so that when it appears says nothing about the data (a slower release is published late and counted)."
    )
    size_seconds: float = Field(300.0, gt=0, description="Window length.")
    allowed_lateness_seconds: float = Field(5.0, ge=0, description="How long after its end a window waits for late events before it closes.")
    max_catch_up_windows: int | None = Field(
        24, ge=0, description="After downtime, how many of the most recent missed windows are still released from the backlog; "
        "older ones are suppressed (reason catch_up) so they cannot spend the budget the live windows need. Always 0 with the "
        "embedded broker (it starts empty); null = no cap."
    )
    release_grace_seconds: float = Field(
        30.0, ge=0,
        description="Public: a window is released once every input partition has reported it, or at the latest this "
        "long after its close with what has arrived; longer than a consumer-group rejoin (docs/scaling.md).",
    )
    on_stop: Literal["release_due", "release_current"] = Field(
        "release_due",
        description="On SIGTERM: release the windows whose close time has passed and leave the current one to the "
        "next run (its events are re-read), or also release the current window early (later events for it are late).",
    )
    first_window: Literal["start", "backlog"] = Field(
        "start",
        description="Where a fresh ledger's schedule begins: `start`, the window the monitor starts in (events already "
        "waiting in the topic are late); `backlog`, the oldest window within allowed_lateness_seconds + "
        "release_grace_seconds, so a new consumer group on a retained topic counts what waits there (those windows are "
        "published late, and a warm-up baseline covers them).",
    )


# The alarm's settings that are constants of its prediction, its schedule or an old override,
# not choices a user makes: docs/configuration.md lists them apart ("Advanced: constants of the
# prediction"), after the settings a user decides (docs/alarm.md, "What you decide, and what it
# costs"). They keep their names and places (the code reads config.alarm.trend_windows etc.);
# changing one needs the alarm benchmarks rerun (docs/benchmarks/alarm-rhythm.md).
ADVANCED_ALARM_KEYS = frozenset({
    "levels_follow_fleet", "recent_windows", "seasonal_windows", "rhythm_slack", "rhythm_slack_follows",
    "profile_bins", "trend_error", "trend_windows", "steady_windows", "threshold_follows_level",
    "threshold", "z", "rate_margin", "run_seconds", "trend_hold_windows", "baseline_refresh_seconds",
    "epsilon_baseline_flagged", "epsilon_baseline_events", "baseline_flag_cap",
})


class AlarmSettings(_Strict):
    """The continual private surge alarm (docs/design.md#the-alarm): one private yes/no per window, paid only when it pages."""

    enabled: bool = Field(True, description="Answer the surge question every window.")
    contamination: float = Field(
        0.01, gt=0, lt=0.5, description="Share of normal events that weigh fully (1) in the alarm's statistic: the upper "
        "score level, the model's calibrated threshold_for(contamination). Reports' flagged counts use the same level."
    )
    contamination_graded: float | None = Field(
        0.1, gt=0, lt=1, description="Share of normal events above the lower score level, where an event's weight starts "
        "rising from 0 (linear up to the upper level): a graded statistic that does not bet on one level; a person still "
        "moves it by at most 1. null: the plain flag at the upper level."
    )
    levels_follow_fleet: bool = Field(
        True, description="When the released event count shows a large fleet, weigh each event at a sparser pair of "
        "levels instead of the configured ones (a half or a fifth of contamination and contamination_graded, the "
        "one with about 15 normal events a window above its upper level; docs/alarm.md). Chosen from the released count "
        "at each baseline, so free; a move restarts the day's comparison and the alarm's run. false: the configured "
        "levels at any traffic."
    )
    false_pages_per_30_days: float = Field(
        1.0, gt=0, description="Expected false pages per 30 days of quiet traffic: the threshold is derived from it, the "
        "statistic's normal spread at the current traffic, the sparse-vector noise and the baseline's own error (scale-free)."
    )
    traffic_swing: float = Field(
        0.3, ge=0, lt=1, description="Daily swing of the number of people online around the baseline's mean (public knowledge "
        "of the fleet, e.g. 0.3 for +-30 %): the false-page rate is averaged over it, since busy windows vary more."
    )
    follow_rhythm: bool = Field(
        True, description="Compare each window with the same people's recent windows and yesterday's same hour (the rhythm "
        "reference, docs/alarm.md), not with one daily rate: traffic whose make-up changes with the hour does not page. "
        "Costs no epsilon; the page noise widens by rhythm_slack."
    )
    recent_windows: int = Field(
        12, ge=2, le=288, description="Windows in the rhythm reference's recent level (12 x 5 minutes: the last hour)."
    )
    seasonal_windows: int = Field(
        5, ge=1, le=287, description="Windows around the same hour on each of the last two days in the rhythm reference (odd: "
        "centred). Few, so that a ramp's kink a day ago is not smeared into today's prediction."
    )
    rhythm_slack: float = Field(
        0.5, gt=0, le=1, description="How far below -rate one person's term may go against the rhythm reference: one person "
        "moves the statistic within an interval of width 1 + rhythm_slack. Its low end must sit below the busiest hour's "
        "share too: 0.5 covers a share weighed three times the day's mean (docs/alarm.md). With rhythm_slack_follows, "
        "the most a run's slack may be."
    )
    rhythm_slack_follows: bool = Field(
        True, description="With follow_rhythm: each run opens with the slack, up to rhythm_slack in steps of 0.05, whose "
        "thresholds are lowest on average at the released profile's quietest, middle and busiest hour (at its first "
        "window before a profile), the clip's expected lift counted in the threshold (worked out from the "
        "prediction's coefficients and the released level; docs/alarm.md#traffic-with-a-daily-rhythm): the pages' "
        "noise narrows where the reference's prediction is spread over many windows. Free: chosen from public numbers before "
        "the run's first query. false: every run uses rhythm_slack."
    )
    profile_bins: int = Field(
        24, ge=0, le=288, description="With follow_rhythm: the daily baseline also releases its flagged total per each of this "
        "many equal parts of the UTC day (three quarters of epsilon_baseline_flagged: one histogram; smoothed to 3 harmonics, "
        "averaged over the last 3 days' releases), and the threshold's spread follows the hour. 0: off."
    )
    weekend_days: list[int] = Field(
        default_factory=list, description="With follow_rhythm: days of the week (UTC; 0 = Monday ... 6 = Sunday) whose "
        "make-up differs from the other days', e.g. [5, 6]. The rhythm reference then compares a day only with the last "
        "days of its own kind within two days, and a day with none (a Saturday, a Monday) follows the last hour's trend, "
        "as a first day does, held by each of the last three days and the same weekday a week back. [] (default): every day alike, "
        "and a day whose released rates differ from the days before is treated so."
    )
    trend_error: float = Field(
        0.02, ge=0, lt=1, description="Before a day of history the rhythm reference extrapolates the last hour's trend: how "
        "far that may miss the rhythm, as a share of the normal flagged count (the threshold counts it; a smooth daily "
        "wave of up to 2.8 x is missed by at most 0.028, a shift change within the hour by far more than any margin)."
    )
    trend_windows: int = Field(
        10, ge=2, le=288, description="Windows the rhythm reference's trend goes through before a day of history (10 x 5 "
        "minutes): fewer follow a shift change sooner, at a wider spread, and weigh the last window more than the "
        "rhythm_slack can hold (a lift of the statistic)."
    )
    steady_windows: int = Field(
        36, ge=0, le=288, description="Windows the rhythm reference's steady line goes through (36 x 5 minutes; 0: none), "
        "above trend_windows: it comes first and the threshold is its own (its spread is the smallest: 1.12 where the "
        "rhythm mode's prediction's is 1.23). Before a day of history the line through trend_windows holds it within a "
        "tenth of a threshold of its own where the traffic bends, which a line "
        "through 3 hours lags and overshoots; from then on it comes first only where the released profile is straight "
        "over its 3 hours, and the rhythm mode's prediction holds it (docs/alarm.md#traffic-with-a-daily-rhythm)."
    )
    threshold_follows_level: bool = Field(
        True, description="With follow_rhythm: the threshold rises and falls with each window's predicted flagged weight "
        "(a line above the one false_pages_per_30_days derives at every level up to 4 times the released rate's), so "
        "a level the daily baseline did not expect (a warm-up at night, a shift that starts, new firmware) does not "
        "page. Free: the statistic's interval is unchanged (docs/alarm.md)."
    )
    threshold: float | None = Field(
        None, ge=0, description="Absolute override (excess weighted events per window that page, plus z and rate_margin); "
        "null (recommended): derived from false_pages_per_30_days."
    )
    z: float | None = Field(None, ge=0, description="With an absolute threshold only: extra margin in standard deviations sqrt(rate x mean events).")
    rate_margin: float | None = Field(
        None, ge=0, description="With an absolute threshold only: extra margin as a share of the expected count (rate x mean events)."
    )

    @property
    def trend_hold(self) -> int:
        """The hold after a page of the first day's trend: ``trend_hold_windows``, or the longer of
        ``hold_windows`` and ``trend_windows``."""
        return max(self.hold_windows, self.trend_windows) if self.trend_hold_windows is None else self.trend_hold_windows

    @model_validator(mode="after")
    def _profile_divides_the_day(self) -> "AlarmSettings":
        if self.profile_bins and 86400 % self.profile_bins:
            raise ValueError(f"profile_bins ({self.profile_bins}) must divide the day's 86400 seconds (e.g. 6, 12, 24)")
        return self

    @model_validator(mode="after")
    def _weekdays(self) -> "AlarmSettings":
        if any(not 0 <= d <= 6 for d in self.weekend_days) or len(set(self.weekend_days)) != len(self.weekend_days):
            raise ValueError(f"weekend_days ({self.weekend_days}) must be distinct weekdays, 0 (Monday) to 6 (Sunday)")
        return self

    @model_validator(mode="after")
    def _steady_above_the_trend(self) -> "AlarmSettings":
        if self.steady_windows and self.steady_windows <= self.trend_windows:
            raise ValueError(f"steady_windows ({self.steady_windows}) must be 0 (none) or more than trend_windows "
                             f"({self.trend_windows}): its spread is the smaller only over more windows")
        return self

    @model_validator(mode="after")
    def _graded_below(self) -> "AlarmSettings":
        if self.contamination_graded is not None and self.contamination_graded <= self.contamination:
            raise ValueError(f"contamination_graded ({self.contamination_graded}) must be larger than contamination "
                             f"({self.contamination}): the weight rises from the lower level to the upper one")
        return self

    epsilon_threshold: float = Field(0.6, gt=0, description="Epsilon of one run's noisy threshold, charged when the run opens.")
    epsilon_page: float = Field(0.5, gt=0, description="Epsilon of each page (a positive answer), charged when it pages; quiet windows are free.")
    run_seconds: float = Field(
        86400.0, gt=0, description="Calendar of the alarm's runs, aligned on the epoch (UTC days by default): at each boundary a "
        "run that has paged ends (its pages are charged over its whole span) and a quiet one goes on (its threshold then "
        "counts once in every rolling period it touches, where a new run would add a second)."
    )
    hold_windows: int = Field(3, ge=0, description="Windows that keep paging after a positive answer, with no query and no cost.")
    trend_hold_windows: int | None = Field(
        None, ge=0, description="With follow_rhythm: the hold after a page while the rhythm reference follows the first "
        "day's trend (null: the longer of hold_windows and trend_windows). That trend cannot tell a surge from a shift "
        "that starts, and lags the change until it has gone through it: a shorter hold pages the same change again."
    )
    baseline_warmup_seconds: float = Field(10800.0, gt=0, description="Span of the first baseline estimate; the alarm starts after it.")
    baseline_refresh_seconds: float = Field(86400.0, gt=0, description="Span of each later baseline estimate (a public schedule).")
    epsilon_baseline_flagged: float = Field(0.08, gt=0, description="Epsilon of a baseline estimate's flagged total.")
    epsilon_baseline_warmup: float = Field(
        0.25, gt=0, description="Epsilon of the first estimate's flagged total: its short span holds few windows, so the same "
        "error needs more epsilon (paid once, at the first start)."
    )
    epsilon_baseline_events: float = Field(0.02, gt=0, description="Epsilon of a baseline estimate's event total.")
    baseline_flag_cap: int = Field(
        16, ge=1, description="Flagged events of one entity counted per baseline span (clipping bounds the estimate's sensitivity; "
        "a normal person is rarely flagged): the warm-up span's cap and the least of a later span's, which grows with the "
        "released traffic. Used with stream.entity_field; without it each event is its own unit."
    )

    @property
    def run_epsilon(self) -> float:
        """What a run that pages once costs (pure DP): the least the budget must hold for the alarm to answer."""
        return self.epsilon_threshold + self.epsilon_page

    @property
    def baseline_epsilon(self) -> float:
        """What one baseline estimate after the first costs (pure DP)."""
        return self.epsilon_baseline_flagged + self.epsilon_baseline_events


class ReportSettings(_Strict):
    """A window's detailed report (docs/design.md#the-report, docs/report.md): on a page, and on a public schedule.

    The shipped report says where: the event count, the alarm's flagged count, and the
    flagged events counted by the feature that finds each one most unusual (by the model's
    one-feature grids, or by how far moving that feature lowers its score), naming the features
    that carry them. The seed's distance-based outlier count and top-h
    subspaces are off by default: at a share of a 0.3 report their 95 % intervals are far
    wider than anything a window holds (``noise_problems`` refuses such a setting).
    """

    on_alarm: bool = Field(True, description="Release a detailed report of every window that pages.")
    every_seconds: float | None = Field(
        None, gt=0, description="Also release a detailed report of one window every so many seconds (a public schedule); null: only on pages."
    )
    reserve_pages: int = Field(
        6, ge=0, description="Pages come before reports: a report is released only if the budget still pays a new alarm "
        "run and this many pages after it (on a day of many pages the alarm keeps answering; some pages come without "
        "a report)."
    )
    max_events: int = Field(
        10000, ge=1, description="Public upper bound on the events one window holds (with stream.entity_field: the number "
        "of entities). A count's plausible range is [0, max_events]: a count whose 95 % interval is wider than that "
        "range is noise, and the config check refuses to spend on it."
    )
    epsilon_events: float = Field(0.03, gt=0, description="Epsilon of the report's event count (sensitivity 1).")
    epsilon_flagged: float = Field(0.05, gt=0, description="Epsilon of the count of flagged events, at the alarm's threshold (sensitivity 1).")
    epsilon_grids: float = Field(
        0.2, gt=0, description="Epsilon of the report's 'where': the flagged events counted by the feature that finds each "
        "most unusual (by the model's one-feature grids, or by how far moving that feature lowers its score). Each event is in one part, so the whole "
        "histogram is one release of sensitivity 1 (Laplace on every part)."
    )
    epsilon_normal_parts: float | None = Field(
        0.025, gt=0, description="Epsilon of normal traffic's 'where': every daily baseline estimate (not the warm-up one) "
        "also releases its span's flagged weight per part, and a report's excess in a feature is judged against that share "
        "of this traffic (until then, against the model's own guess). Paid with the baseline, only when reports say where. "
        "null: the model's guess only."
    )
    k: int = Field(5, ge=1, description="An event is an outlier when fewer than k other events lie within radius.")
    radius: float = Field(0.1, gt=0, description="Neighbourhood radius in the scaled [0,1] space (normalised distance).")
    mechanism: Literal["auto", "global", "laplace", "gaussian", "student_t"] = Field(
        "auto", description="Noise mechanism for outlier counts; auto picks from public parameters."
    )
    epsilon_count: float | None = Field(
        None, gt=0, description="Epsilon of the seed's full-space outlier count; null (default) releases none: in 5-D its "
        "95 % interval at a report's share (about +-13,000 at 0.05) is far wider than a window."
    )
    delta_count: float = Field(1e-9, ge=0, lt=1, description="Delta of the full-space outlier count.")
    top_h: int = Field(0, ge=0, description="How many of the seed's top subspaces to report; 0 (default) turns the top-h query off.")
    subspace_dims: int = Field(1, ge=1, description="Dimension of the candidate subspaces.")
    epsilon_top: float = Field(0.05, gt=0, description="Epsilon of choosing the top-h subspaces (exponential mechanism).")
    epsilon_top_count: float = Field(0.02, gt=0, description="Epsilon of each chosen subspace's count.")
    delta_top_count: float = Field(1e-10, ge=0, lt=1, description="Delta of each chosen subspace's count.")

    def top_h_for(self, n_features: int) -> int:
        """How many subspaces a window reports: top_h, capped at the number of candidates."""
        if not self.top_h:
            return 0
        return min(self.top_h, math.comb(n_features, self.subspace_dims))

    def cost(self, n_features: int, n_grids: int = 0) -> tuple[float, float]:
        """(epsilon, delta) one detailed report costs, by basic composition of its parts.

        Uses ``top_h_for(n_features)``, so the ledger, the alert record, the config check and
        ``monitor budget`` all state what is really spent. The 'where' part is paid only
        when the model has more than one grid (``n_grids``).

        >>> ReportSettings(epsilon_count=0.4, epsilon_flagged=0.2, epsilon_top=0.2, epsilon_top_count=0.1, epsilon_events=0.1,
        ...                delta_count=1e-6, delta_top_count=1e-7, top_h=5).cost(n_features=2)
        (1.1, 1.2e-06)
        >>> ReportSettings().cost(n_features=5, n_grids=9)  # the shipped report
        (0.28, 0.0)
        """
        h = self.top_h_for(n_features)
        parts = [self.epsilon_flagged, self.epsilon_events]
        delta = 0.0
        if self.epsilon_count is not None:
            parts.append(self.epsilon_count)
            delta += self.delta_count
        if n_grids > 1:
            parts.append(self.epsilon_grids)
        if h:
            parts += [self.epsilon_top] + [self.epsilon_top_count] * h
            delta += h * self.delta_top_count
        return math.fsum(parts), delta

    def count_accuracies(self, n_features: int, n_grids: int = 0) -> dict[str, float]:
        """Each count the report would publish, by its config key, with the half-width of its
        95 % interval from public parameters only (epsilon, the public sensitivity bound; for
        the smooth mechanisms the typical smooth bound "auto" uses, their scale following the
        data). Public arithmetic, free.

        >>> acc = ReportSettings().count_accuracies(n_features=5, n_grids=9)
        >>> sorted(acc), round(acc["epsilon_flagged"], 1)
        (['epsilon_events', 'epsilon_flagged', 'epsilon_grids'], 59.9)
        """
        from monitor.outliers.mechanisms import choose_mechanism, noise_std

        ln20 = math.log(20.0)  # a Laplace variable exceeds ln(20) scales with probability 5 %
        out = {"epsilon_events": ln20 / self.epsilon_events, "epsilon_flagged": ln20 / self.epsilon_flagged}
        if n_grids > 1:
            out["epsilon_grids"] = ln20 / self.epsilon_grids

        def seed_count(eps: float, delta: float, dim: int) -> float:
            mech = choose_mechanism(eps, delta, self.k, dim) if self.mechanism == "auto" else self.mechanism
            # std / sqrt(2) is the Laplace-equivalent scale, so ln(20) of it is a 95 % half-width
            return ln20 * noise_std(mech, eps, delta, self.k, dim) / math.sqrt(2.0)

        if self.epsilon_count is not None:
            out["epsilon_count"] = seed_count(self.epsilon_count, self.delta_count, n_features)
        if self.top_h_for(n_features):
            out["epsilon_top_count"] = seed_count(self.epsilon_top_count, self.delta_top_count, self.subspace_dims)
        return out

    def noise_problems(self, n_features: int, n_grids: int = 0) -> list[str]:
        """One message per count whose 95 % interval is wider than its plausible range
        [0, max_events]: such a count is noise, and spending on it buys nothing."""
        problems = []
        for key, half in self.count_accuracies(n_features, n_grids).items():
            if 2.0 * half > self.max_events:
                problems.append(
                    f"report.{key}: its count's 95 % interval (+-{half:,.0f}) is wider than anything a window holds "
                    f"(report.max_events = {self.max_events:,}); raise report.{key} (or report.max_events if windows "
                    f"are larger) or turn that part off"
                )
        return problems


class BudgetSettings(_Strict):
    """The budget accountant (docs/design.md#the-budget)."""

    period_seconds: float = Field(86400.0, gt=0, description="Rolling period the budget applies to.")
    epsilon: float = Field(12.0, gt=0, description="Total epsilon per privacy unit per period.")
    delta: float = Field(1e-6, ge=0, lt=1, description="Total delta per privacy unit per period.")
    accountant: Literal["basic", "pld"] = Field("basic", description="Composition: basic sums, or privacy-loss distributions. Every charge of the stream (alarm runs and pages, baselines, reports) is adaptively triggered and no PLD filter theorem covers it, so under either it is summed: pld spends as basic does (docs/budget.md).")
    lifetime_epsilon: float | None = Field(
        None, gt=0,
        description="Optional cap on everything this ledger ever charges (summed): the period budget bounds one period, "
                    "a person present for 30 days can lose 30 periods' worth. Null: no cap.",
    )
    ledger: Path = Field(Path("monitor-ledger.sqlite"), description="SQLite ledger of released windows.")
    reference_epsilon: float = Field(5.0, gt=0, description="Total epsilon-DP for the reference data (fit and DP identify queries); never refills.")
    reference_sensitive_epsilon: float = Field(
        5.0, gt=0, description="Total epsilon of each (epsilon, k)-sensitive-privacy notion of identify answers, kept apart from the DP total."
    )
    reference_ledger: Path = Field(Path("reference-ledger.sqlite"), description="SQLite ledger of the reference data.")


class MetricsSettings(_Strict):
    """The Prometheus endpoint."""

    host: str = Field("127.0.0.1", description="Address to serve /metrics on.")
    port: int = Field(9108, ge=0, le=65535, description="Port of /metrics for analysts and dashboards: private values and public facts only; 0 picks a free one.")
    operational_port: int | None = Field(
        9109, ge=0, le=65535, description="Port of the operators' /metrics (events, dead letters, lag, latency: NOT private, "
        "never for analysts); 0 picks a free one, null turns it off."
    )


class MonitorConfig(_Strict):
    """The whole configuration file."""

    features: list[Feature] = Field(min_length=1, description="Numeric features with public bounds.")
    model: ModelSettings = Field(default_factory=ModelSettings)
    stream: StreamSettings = Field(default_factory=StreamSettings)
    window: WindowSettings = Field(default_factory=WindowSettings)
    alarm: AlarmSettings = Field(default_factory=AlarmSettings)
    report: ReportSettings = Field(default_factory=ReportSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)

    @field_validator("features")
    @classmethod
    def _unique_names(cls, features: list[Feature]) -> list[Feature]:
        seen: set[str] = set()
        for f in features:
            if f.name in seen:
                raise ValueError(f"feature name {f.name!r} appears twice")
            seen.add(f.name)
        return features

    @model_validator(mode="after")
    def _consistent(self) -> "MonitorConfig":
        if self.report.subspace_dims > len(self.features):
            raise ValueError(
                f"report.subspace_dims ({self.report.subspace_dims}) exceeds the number of features ({len(self.features)})"
            )
        r = self.report
        if r.mechanism in ("laplace", "gaussian"):
            # These smooth mechanisms are (epsilon, delta)-DP only for delta > 0.
            if r.epsilon_count is not None and r.delta_count == 0:
                raise ValueError(f"report.delta_count must be positive with report.mechanism {r.mechanism!r}")
            if r.top_h and r.delta_top_count == 0:
                raise ValueError(f"report.delta_top_count must be positive with report.mechanism {r.mechanism!r}")
        # A count whose interval is wider than anything a window holds is refused, not paid for.
        from monitor.model._defaults import min_grids

        problems = r.noise_problems(len(self.features), min_grids(len(self.features)))
        if problems:
            raise ValueError("; ".join(problems))
        b = self.budget
        for what, (eps, delta) in (("one detailed report", self.report_cost()),
                                   ("an alarm run that pages once", (self.alarm.run_epsilon, 0.0)),
                                   ("one baseline estimate", self.baseline_cost()),
                                   ("the first baseline estimate", (self.alarm.epsilon_baseline_warmup + self.alarm.epsilon_baseline_events, 0.0))):
            if eps > b.epsilon or delta > b.delta:
                raise ValueError(
                    f"{what} costs (epsilon={eps:g}, delta={delta:g}), more than the period budget "
                    f"(epsilon={b.epsilon:g}, delta={b.delta:g}): it could never be paid"
                )
        return self

    def report_cost(self) -> tuple[float, float]:
        """(epsilon, delta) of one detailed report with the model this config fits.

        The report's grid part is paid only with more than one model grid. The number of
        grids depends on the fit's noisy record count, but the default rule never gives
        fewer than ``min_grids(d)`` (``monitor.model.default_layout``), which already says
        whether there is more than one: this is what the releaser charges.
        """
        from monitor.model._defaults import min_grids

        return self.report.cost(len(self.features), min_grids(len(self.features)))

    def normal_parts_epsilon(self, n_grids: int | None = None) -> float:
        """What releasing normal traffic's parts adds to each daily baseline estimate:
        ``report.epsilon_normal_parts`` when reports can happen and say where (more than one
        model grid: ``n_grids``, or the fewest the default layout gives, as ``report_cost``),
        else 0."""
        from monitor.model._defaults import min_grids

        r = self.report
        grids = min_grids(len(self.features)) if n_grids is None else n_grids
        if r.epsilon_normal_parts is None or grids <= 1 or not (r.on_alarm or r.every_seconds):
            return 0.0
        return r.epsilon_normal_parts

    def baseline_cost(self) -> tuple[float, float]:
        """(epsilon, delta) of one baseline estimate after the first (pure DP): the alarm's
        flagged and event totals, and normal traffic's parts (``normal_parts_epsilon``)."""
        return self.alarm.baseline_epsilon + self.normal_parts_epsilon(), 0.0

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    @property
    def bounds(self) -> "list[tuple[float, float]]":
        """Public (min, max) per feature, in feature order."""
        return [(f.min, f.max) for f in self.features]


# Keys of earlier versions, with what replaced them.
_RENAMED = {
    "release": "renamed `report` (the detailed report of a window that pages); move its keys there",
    "alarm.epsilon_queries": "renamed `alarm.epsilon_page`: each page is now paid when it is given",
    "alarm.max_positives": "removed: a run answers until `alarm.run_seconds` ends, each page paid when given",
    "alarm.max_run_seconds": "renamed `alarm.run_seconds` (runs are now aligned on the epoch)",
    "metrics.outlier_alert_level": "removed: the surge alert now fires on the private alarm (see the `alarm` block)",
    "alarm.curve_windows": "removed: the first day's steady line (`alarm.steady_windows`), guarded by the trend, does its job",
}


def _key_path(loc: tuple, data: Any) -> str:
    """A pydantic error location as the user's key: ``features[temprature].max``, not ``features.2.max``.

    >>> _key_path(("features", 1, "max"), {"features": [{"name": "hr"}, {"name": "temprature"}]})
    'features[temprature].max'
    >>> _key_path(("features", 1), {"features": [{"name": "hr"}, {"min": 0}]})
    'features[1]'
    """
    parts: list[str] = []
    node = data
    for p in loc:
        if isinstance(p, int):
            item = node[p] if isinstance(node, list) and p < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            parts[-1:] = [f"{parts[-1] if parts else ''}[{name if isinstance(name, str) and name else p}]"]
            node = item
        else:
            parts.append(str(p))
            node = node.get(p) if isinstance(node, dict) else None
    return ".".join(parts)


def _format_error(err: ValidationError, source: str, data: Any = None) -> str:
    """One line (the CLI prints a user error as one line): each bad key and its problem, "; " between them."""
    problems = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = _RENAMED.get(path, "unknown key (check its spelling)")
        problems.append(f"{_key_path(e['loc'], data) or '(top level)'}: {' '.join(msg.split())}")
    return f"invalid configuration in {source}: " + "; ".join(problems)


def parse_config(data: Any, source: str = "<config>") -> MonitorConfig:
    """Validate an already-parsed mapping; raise ConfigError naming each bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid configuration in {source}: the top level must be a mapping of keys")
    try:
        return MonitorConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err, source, data)) from None


def load_config(path: str | Path) -> MonitorConfig:
    """Read and validate a YAML config file.

    Relative paths inside it (model, ledgers) are resolved against the file's folder,
    so the monitor behaves the same whatever directory it is started from.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read configuration {path}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"configuration {path} is not valid YAML: {err}") from None
    cfg = parse_config(data, str(path))
    return _resolve_paths(cfg, path.parent)


def _resolve_paths(cfg: MonitorConfig, base: Path) -> MonitorConfig:
    def rel(p: Path) -> Path:
        return p if p.is_absolute() else (base / p)

    model = cfg.model.model_copy(update={"path": rel(cfg.model.path)})
    budget = cfg.budget.model_copy(
        update={"ledger": rel(cfg.budget.ledger), "reference_ledger": rel(cfg.budget.reference_ledger)}
    )
    return cfg.model_copy(update={"model": model, "budget": budget})
