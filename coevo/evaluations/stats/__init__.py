"""Statistics over rollout scores. Pages, the API and the evaluation engine take their figures
from here; import each from the module that holds it.

Everything is a pure function of its inputs (and a seed where resampling is involved), so a page
shows the same interval on every reload. Scores are per rollout in [0, 1]; a task evaluated for k
epochs has k rollouts, and its per-task score is their mean (its pass rate when scores are 0/1).

- `means`: a mean with its interval (`wilson_interval`, `pass_rate_summary`,
  `mean_score_summary`: Wilson for 0/1 results, a bootstrap over tasks otherwise) and the
  unbiased pass@k estimator of Chen et al. (2021) (`pass_at_k`, `pass_at_k_summary`).
- `paired`: `paired_comparison` of two evaluations on the same tasks (candidate vs parent or
  channel holder), with the exact McNemar / sign test.
- `sequential`: `sequential_paired_decision`, anytime-valid early stopping of a paired minibatch.
- `racing`: `Race`, `race`, choosing the best of several candidates with early elimination.
- `base`: what they share (`Interval`, `InvalidStatisticsInput`, the bootstrap, the normal
  quantile, input checks).
"""
