"""Private "is this record a (beta, r)-anomaly of the reference data?" queries (docs/design.md#anomaly-queries).

- ``anomaly``: the seed's definition and the distance to the other answer (exact on the
  ordinary graph, a safe bound on the k-sensitive graph).
- ``mechanism``: the optimal private yes/no answer, ``AnomalyIdentifier`` over scaled data.
- ``cli``: ``monitor identify``, charged to the reference ledger.

>>> ident = AnomalyIdentifier(beta=2, radius=0.2).fit([[0.1, 0.1], [0.15, 0.1], [0.2, 0.1]])
>>> ident.exact_answers([[0.15, 0.1], [0.9, 0.9]]).tolist()   # not private
[False, False]
"""

from monitor.identify.anomaly import FlipDistance, Neighbourhood, flip_distance, is_anomaly
from monitor.identify.mechanism import AnomalyIdentifier, IdentifyAnswer, probability_correct, randomized_answer

__all__ = [
    "AnomalyIdentifier",
    "IdentifyAnswer",
    "Neighbourhood",
    "FlipDistance",
    "flip_distance",
    "is_anomaly",
    "probability_correct",
    "randomized_answer",
]
