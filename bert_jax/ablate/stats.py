"""Mean, spread and Welch's t-test over finetuning seeds, in numpy and math only (scipy is not a dependency).

Welch's test (Welch 1947) compares two means without assuming equal variances: t = (m1 - m2) / sqrt(v1/n1 +
v2/n2) with the Welch-Satterthwaite degrees of freedom. The two-sided p-value is the regularized incomplete
beta function I_x(df/2, 1/2) at x = df / (df + t^2), evaluated by its continued fraction (Numerical
Recipes, 3rd ed., 6.4).
"""

import dataclasses
import math

import numpy as np

ALPHA = 0.05   # the level at which a difference counts as exceeding the seed variation


@dataclasses.dataclass(frozen=True)
class Welch:
  t: float
  df: float
  p: float   # two-sided; nan when the test cannot be made (fewer than 2 values on a side, or no spread)

  @property
  def significant(self) -> bool:
    return not math.isnan(self.p) and self.p < ALPHA


def mean_std(values) -> tuple[float, float]:
  """Mean and sample standard deviation (ddof 1; 0 for a single value)."""
  v = np.asarray(values, np.float64)
  return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def welch_t_test(a, b) -> Welch:
  """Welch's two-sided t-test of mean(a) == mean(b)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if len(a) < 2 or len(b) < 2:
    return Welch(math.nan, math.nan, math.nan)
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  diff = float(a.mean() - b.mean())
  if va + vb == 0:   # no spread on either side: equal means are no difference, others are certain
    return Welch(0.0 if diff == 0 else math.copysign(math.inf, diff), math.nan, 1.0 if diff == 0 else 0.0)
  t = diff / math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  return Welch(float(t), float(df), student_t_two_sided_p(t, df))


def student_t_two_sided_p(t: float, df: float) -> float:
  """P(|T| >= |t|) for Student's t with `df` (real, > 0) degrees of freedom."""
  if math.isinf(t):
    return 0.0
  return regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
  """I_x(a, b) for a, b > 0 and x in [0, 1]."""
  if x <= 0.0:
    return 0.0
  if x >= 1.0:
    return 1.0
  log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
  if x < (a + 1.0) / (a + b + 2.0):   # the continued fraction converges fast here; else use the symmetry
    return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
  return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def _beta_continued_fraction(a: float, b: float, x: float, max_terms: int = 300, eps: float = 1e-15) -> float:
  """Lentz's method for the continued fraction of I_x(a, b) (Numerical Recipes, betacf)."""
  tiny = 1e-300
  c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
  d = 1.0 / (d if abs(d) > tiny else tiny)
  h = d
  for m in range(1, max_terms + 1):
    for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
      d = 1.0 + num * d
      d = 1.0 / (d if abs(d) > tiny else tiny)
      c = 1.0 + num / c
      c = c if abs(c) > tiny else tiny
      h *= d * c
    if abs(d * c - 1.0) < eps:
      break
  return h
