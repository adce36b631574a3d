"""The detailed report a page comes with: private maths only (no streaming, no Kafka).

- ``release_report``: one window's report (counts, 'where', the seed's optional parts, headline);
- ``project_nested``, ``project_partition``: consistent numbers by projection (post-processing);
- ``candidate_parts``, ``grid_unusual``, ``normal_part_shares``, ``part_counts``, ``part_of``, ``release_parts``: the private 'where'.
"""

from monitor.report.consistency import project_nested, project_partition
from monitor.report.detailed import headline, release_report
from monitor.report.where import candidate_parts, grid_unusual, normal_part_shares, part_counts, part_of, release_parts

__all__ = ["release_report", "headline", "project_nested", "project_partition", "candidate_parts", "grid_unusual",
           "normal_part_shares", "part_counts", "part_of", "release_parts"]
