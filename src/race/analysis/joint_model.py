"""One joint model of the study: every candidate allocation fitted together, so that a small
model's visible midpoint locates a large model's.

Allocation a (K of them) has model parameters N_a and group size G_a; with x = ln C
(counted FLOPs), dn_a = ln N_a - mean_a ln N_a and dg_a = ln G_a - mean_a ln G_a:

    mu_a(x) = r0_a + (A_a - r0_a) expit(s_a (x - m_a)),  s_a = s exp(w_a)   (slope in ln C)
    m_a     = c + gamma dn_a + delta dg_a + u_a                      (midpoint, ln C)
    A_a     = r0_a + (1 - r0_a) expit(a0 + eta dn_a + v_a),  eta >= 0   (asymptote in (r0_a, 1))

r0_a is the measured step-0 score (data, not a parameter); s is the typical slope. The
allocation effects u_a, v_a, w_a are shrunk toward 0 by Gaussian penalties whose scales
tau_u, tau_v, tau_w are estimated (empirical Bayes: tau^2 = (sum_a u_a^2 + K0 tau0^2) /
(K + K0), alternated with the fit, so a study whose allocations do not follow the trend
earns larger effects). The global parameters have weak Gaussian priors (``PRIORS``; the
midpoint trend gamma is centred at 1: at a fixed number of optimizer steps the FLOPs per
step, hence the midpoint in FLOPs, grow in proportion to N). All priors and K0 were set on
the tuning generator (``race.analysis.synthetic``) and frozen.

The fit is penalised weighted least squares: data residuals sqrt(w_i / (phi p_i (1 - p_i)))
(mu_i - y_i) with w_i = problems x seed multiplicity (binomial weights), p_i the fitted mean
and phi >= 1 the dispersion (seed noise makes points vary more than binomially: phi = the
data residual sum of squares / (points - parameters), the 6 + 3K parameters counted at their
effective share under the penalties: :func:`effective_parameters`), plus one residual (theta_j -
prior_j) / sd_j per prior and u_a / tau_u, v_a / tau_v, w_a / tau_w. It is minimised by Levenberg-Marquardt
with the analytic Jacobian, vectorised over bootstrap replicates (one row each, warm-started
from the point fit: :func:`refit`), so every replicate refits the whole joint model.

**Identified midpoint**: allocation a's midpoint is located *by its own data* when its data
reach at least one slope unit past it, m_a + 1 / s_a <= the largest ln C it was evaluated at
(the curve has visibly bent; a midpoint just inside the data is still a guess); *by the trend* when not, but some other
allocation's is (the trend in N and G carries it over); *not located* when no allocation's
midpoint lies inside its pilots: then nothing in the study shows saturation, the asymptotes
rest on the priors, and a rising forecast is "open above".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit

# name: (prior mean, prior sd); "c" and "a0" are relative (c: to the mean ln C of the data)
PRIORS: dict[str, tuple[float, float]] = {"c": (0.0, 6.0), "gamma": (1.0, 0.5), "delta": (0.0, 1.0),
                                          "log_s": (float(np.log(1.2)), 0.8), "a0": (0.0, 2.5), "eta": (0.0, 1.0)}
GLOBAL = ("c", "gamma", "delta", "log_s", "a0", "eta")
TAU0 = {"u": 1.0, "v": 1.0, "w": 0.3}  # prior scales of the allocation effects (ln C, headroom logit, ln slope)
K0 = 2.0  # the prior scale is worth this many allocations
ETA = GLOBAL.index("eta")


@dataclass
class JointData:
    """Evaluation points of K allocations, for R replicate rows (R = 1: the observed data)."""

    x: np.ndarray  # (n,) ln C of each point
    alloc: np.ndarray  # (n,) allocation index of each point
    y: np.ndarray  # (R, n) scores
    w: np.ndarray  # (R, n) problems x seed multiplicity
    r0: np.ndarray  # (R, K) step-0 scores
    dn: np.ndarray  # (K,) ln N_a - mean ln N
    dg: np.ndarray  # (K,) ln G_a - mean ln G

    @property
    def k(self) -> int:
        return len(self.dn)

    @property
    def x_max(self) -> np.ndarray:
        """(K,) largest ln C evaluated per allocation."""
        return np.array([self.x[self.alloc == a].max() for a in range(self.k)])


@dataclass
class JointFit:
    """Parameters per replicate row and the scales they were fitted with."""

    theta: np.ndarray  # (R, 6 + 3K): GLOBAL, then u_1..u_K, v_1..v_K, w_1..w_K
    r0: np.ndarray  # (R, K)
    dn: np.ndarray
    dg: np.ndarray
    tau: tuple[float, float, float]  # (tau_u, tau_v, tau_w)
    phi: float
    p: np.ndarray  # (n,) fitted means of the point fit (the weights' p)
    cost: np.ndarray  # (R,) penalised sum of squares

    def midpoint(self) -> np.ndarray:
        """(R, K) m_a = c + gamma dn_a + delta dg_a + u_a."""
        t, k = self.theta, len(self.dn)
        return t[:, [0]] + t[:, [1]] * self.dn + t[:, [2]] * self.dg + t[:, 6:6 + k]

    def asymptote(self) -> np.ndarray:
        """(R, K) A_a = r0_a + (1 - r0_a) expit(a0 + eta dn_a + v_a)."""
        t, k = self.theta, len(self.dn)
        return self.r0 + (1 - self.r0) * expit(t[:, [4]] + t[:, [5]] * self.dn + t[:, 6 + k:6 + 2 * k])

    def slope(self) -> np.ndarray:
        """(R, K) s_a = s exp(w_a)."""
        return np.exp(self.theta[:, [3]] + self.theta[:, 6 + 2 * len(self.dn):])

    def predict(self, x: float | np.ndarray) -> np.ndarray:
        """(R, K) mu_a at ln C = ``x`` (a scalar or (K,))."""
        return self.r0 + (self.asymptote() - self.r0) * expit(self.slope() * (np.asarray(x, dtype=float) - self.midpoint()))

    def located(self, x_max: np.ndarray) -> list[str]:
        """Per allocation (point fit, row 0): "own data", "trend" or "not located" (module docstring)."""
        inside = self.midpoint()[0] + 1 / self.slope()[0] <= x_max
        return ["own data" if i else ("trend" if inside.any() else "not located") for i in inside]


def _priors(x_centre: float) -> tuple[np.ndarray, np.ndarray]:
    mean = np.array([PRIORS[g][0] for g in GLOBAL])
    mean[0] += x_centre
    return mean, np.array([PRIORS[g][1] for g in GLOBAL])


def residuals(theta: np.ndarray, d: JointData, sw: np.ndarray, tau: tuple[float, float, float],
              prior: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(R, M) residuals and (R, M, P) Jacobian: data (sqrt weights ``sw`` (R, n)), priors, effects."""
    R, K, n = theta.shape[0], d.k, len(d.x)
    c, gam, dlt, logs, a0, eta = (theta[:, [i]] for i in range(6))
    u, v, w = theta[:, 6:6 + K], theta[:, 6 + K:6 + 2 * K], theta[:, 6 + 2 * K:]
    s = np.exp(logs + w)  # (R, K)
    m = c + gam * d.dn + dlt * d.dg + u  # (R, K)
    h = expit(a0 + eta * d.dn + v)
    k = d.alloc
    z = s[:, k] * (d.x[None, :] - m[:, k])
    g = expit(z)
    r0 = d.r0[:, k]
    amp = (1 - r0) * h[:, k]
    mu = r0 + amp * g
    dz = amp * g * (1 - g)  # dmu/dz
    dq = (1 - r0) * h[:, k] * (1 - h[:, k]) * g  # dmu/dq, q the headroom logit
    dm = -s[:, k] * dz  # dmu/dm
    P = 6 + 3 * K
    J = np.zeros((R, n + P, P))
    onehot = (k[:, None] == np.arange(K)[None, :]).astype(float)  # (n, K)
    J[:, :n, 0], J[:, :n, 1], J[:, :n, 2] = dm, dm * d.dn[k], dm * d.dg[k]
    J[:, :n, 3], J[:, :n, 4], J[:, :n, 5] = dz * z, dq, dq * d.dn[k]
    J[:, :n, 6:6 + K] = dm[:, :, None] * onehot
    J[:, :n, 6 + K:6 + 2 * K] = dq[:, :, None] * onehot
    J[:, :n, 6 + 2 * K:] = (dz * z)[:, :, None] * onehot
    J[:, :n] *= sw[:, :, None]
    mean, sd = prior
    scale = np.concatenate([sd, np.full(K, tau[0]), np.full(K, tau[1]), np.full(K, tau[2])])
    centre = np.concatenate([mean, np.zeros(3 * K)])
    J[:, n:, :] = np.diag(1 / scale)[None]
    r = np.concatenate([sw * (mu - d.y), (theta - centre) / scale], axis=1)
    return r, J


def _lm(theta: np.ndarray, fun, iters: int, rtol: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg-Marquardt, one problem per row of ``theta`` (eta projected onto >= 0); stops
    early once every row has converged (an accepted step lowered its cost by less than
    ``rtol``, relative) or stalled (damping at 1e6: no step lowers the cost)."""
    theta = theta.copy()
    theta[:, ETA] = np.maximum(theta[:, ETA], 0.0)
    r, J = fun(theta)
    cost = np.sum(r * r, axis=1)
    lam = np.full(len(theta), 1e-2)
    done = np.zeros(len(theta), bool)
    eye = np.eye(theta.shape[1])[None]
    for _ in range(iters):
        JtJ = np.einsum("rmp,rmq->rpq", J, J)
        grad = np.einsum("rmp,rm->rp", J, r)
        diag = np.einsum("rpp->rp", JtJ)
        A = JtJ + lam[:, None, None] * (diag[:, :, None] * eye + 1e-9 * eye)
        step = -np.linalg.solve(A, grad[..., None])[..., 0]
        new = theta + step
        new[:, ETA] = np.maximum(new[:, ETA], 0.0)
        r2, J2 = fun(new)
        c2 = np.sum(r2 * r2, axis=1)
        ok = np.isfinite(c2) & (c2 < cost)
        done |= (ok & (cost - c2 <= rtol * cost)) | (lam >= 1e6)  # converged, or no step lowers the cost
        theta[ok], r[ok], J[ok], cost[ok] = new[ok], r2[ok], J2[ok], c2[ok]
        lam = np.clip(np.where(ok, lam / 3, lam * 4), 1e-7, 1e7)
        if done.all():
            break
    return theta, cost


def _sqrt_weights(d: JointData, p: np.ndarray, phi: float) -> np.ndarray:
    pc = np.clip(p, 0.02, 0.98)
    return np.sqrt(d.w / (phi * pc * (1 - pc))[None, :])


def fit_joint(d: JointData, iters: int = 60, rounds: int = 3) -> JointFit:
    """Point fit of the observed data (row 0 of ``d``): multi-start LM, then ``rounds`` of
    (dispersion phi, empirical-Bayes tau_u, tau_v, refit) (module docstring)."""
    d1 = JointData(d.x, d.alloc, d.y[:1], d.w[:1], d.r0[:1], d.dn, d.dg)
    K, n = d.k, len(d.x)
    prior = _priors(float(np.mean(d.x)))
    lo, hi = float(d.x.min()), float(d.x.max())
    starts = [(c0, ls) for c0 in (lo - 1.0, 0.5 * (lo + hi), hi + 1.0, hi + 4.0) for ls in (np.log(0.7), np.log(2.0))]
    theta = np.zeros((len(starts), 6 + 3 * K))
    theta[:, 0] = [c0 for c0, _ in starts]
    theta[:, 1] = PRIORS["gamma"][0]
    theta[:, 3] = [ls for _, ls in starts]
    rep = JointData(d.x, d.alloc, np.repeat(d1.y, len(starts), 0), np.repeat(d1.w, len(starts), 0),
                    np.repeat(d1.r0, len(starts), 0), d.dn, d.dg)
    p, phi, tau = np.clip(d1.y[0], 0.02, 0.98), 1.0, (TAU0["u"], TAU0["v"], TAU0["w"])
    sw = _sqrt_weights(rep, p, phi)
    theta, cost = _lm(theta, lambda t: residuals(t, rep, sw, tau, prior), iters)
    best = theta[[int(np.argmin(cost))]]
    for _ in range(rounds):
        fit = JointFit(best, d1.r0, d.dn, d.dg, tau, phi, p, cost[:1])
        p = np.clip(_mu_points(fit, d1)[0], 0.02, 0.98)
        raw = np.sum(d1.w[0] / (p * (1 - p)) * (p - d1.y[0]) ** 2)
        edf = effective_parameters(residuals(best, d1, _sqrt_weights(d1, p, phi), tau, prior)[1][0], n)
        phi = max(1.0, float(raw / max(n - edf, 1.0)))
        tau = tuple(float(np.sqrt((np.sum(best[0, 6 + i * K:6 + (i + 1) * K] ** 2) + K0 * TAU0[e] ** 2) / (K + K0)))
                    for i, e in enumerate("uvw"))
        sw = _sqrt_weights(d1, p, phi)
        best, cost = _lm(best, lambda t: residuals(t, d1, sw, tau, prior), iters)
    return JointFit(best, d1.r0, d.dn, d.dg, tau, phi, p, cost)


def effective_parameters(J: np.ndarray, n: int) -> float:
    """tr(J_d (J' J)^-1 J_d'): the parameters the data points pay for in a penalised fit whose
    Jacobian ``J`` (M, P) has the ``n`` data rows first, then the prior and effect rows. It is
    6 + 3K for an unpenalised fit and less where the penalties shrink the K allocation effects
    (u, v, w each) toward 0; the dispersion divides the Pearson sum by n minus this."""
    JtJ = J.T @ J
    return float(np.trace(np.linalg.solve(JtJ + 1e-12 * np.eye(len(JtJ)), J[:n].T @ J[:n])))


def _mu_points(fit: JointFit, d: JointData) -> np.ndarray:
    """(R, n) fitted means at the data points."""
    s, m, A = fit.slope(), fit.midpoint(), fit.asymptote()
    k = d.alloc
    return d.r0[:, k] + (A[:, k] - d.r0[:, k]) * expit(s[:, k] * (d.x[None, :] - m[:, k]))


def refit(point: JointFit, d: JointData, iters: int = 12) -> JointFit:
    """Refit every replicate row of ``d`` with the point fit's dispersion, tau and weights'
    p, warm-started from the point fit's parameters."""
    prior = _priors(float(np.mean(d.x)))
    sw = _sqrt_weights(d, point.p, point.phi)
    start = np.repeat(point.theta[:1], d.y.shape[0], axis=0)
    theta, cost = _lm(start, lambda t: residuals(t, d, sw, point.tau, prior), iters)
    return JointFit(theta, d.r0, d.dn, d.dg, point.tau, point.phi, point.p, cost)
