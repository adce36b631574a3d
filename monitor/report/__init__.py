"""The detailed report a page comes with: private maths only (no streaming, no Kafka; proof: docs/proofs/report.md).

- ``release_report``: one window's report (counts, 'where', the seed's optional parts, headline);
- ``project_nested``, ``project_partition``: consistent numbers by projection (post-processing);
- ``simultaneous_low``, ``error_quantile``, ``released_parts_scale``, ``ReportHistory``: which parts stand out (intervals that hold
  for all parts at once);
- ``candidate_parts``, ``grid_unusual``, ``normal_part_shares``, ``part_counts``, ``part_of``, ``release_parts``: the private 'where'.
"""

from monitor.report.consistency import project_nested, project_partition
from monitor.report.detailed import error_quantile, headline, release_report, simultaneous_low
from monitor.report.where import (ReportHistory, candidate_parts, grid_unusual, normal_part_shares, part_counts, part_of, release_parts,
                                  released_parts_scale)

__all__ = ["release_report", "headline", "project_nested", "project_partition", "candidate_parts", "grid_unusual",
           "normal_part_shares", "part_counts", "part_of", "release_parts", "released_parts_scale", "simultaneous_low",
           "error_quantile", "ReportHistory"]
