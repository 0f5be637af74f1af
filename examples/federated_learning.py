"""Federated learning with local differential privacy: LDP-FL's adaptive ranges and shuffling.

A softmax (multinomial logistic) regression is trained by federated averaging over
simulated clients, each holding a few samples of synthetic data (scikit-learn is not a
dpsql dependency). Every round the server broadcasts the global model; each client runs a
few steps of gradient descent on its own data and sends its new weights, perturbed on the
client; the server averages what it gets. Four ways to send the weights, at the same
epsilon per parameter report:

- ``non-private``: the weights themselves (no privacy; the ceiling);
- ``ldp-fl``: the adaptive-range mechanism (:func:`dpsql.local.perturb`) with a range per
  layer (weights and biases), centred on the public global model's layer mean with radius
  its spread plus a public step allowance, and the reports split per parameter and mixed
  by a :class:`dpsql.local.Shuffler` before the server sees them;
- ``fixed-range``: the same mechanism with one range for every layer (the widest of the
  per-layer ranges): what the adaptive ranges buy;
- ``laplace``: each weight clipped into its layer's range plus Laplace noise of scale
  ``2r / epsilon`` (also epsilon-LDP per parameter report).

Privacy: each parameter report is epsilon-LDP; a client sends one per parameter per round,
so against anyone who can link them (the shuffler) a round spends P * epsilon and the
training T * P * epsilon (basic composition). Against the server, which only sees each
parameter's shuffled pool of n reports, a pool is (eps', delta)-DP with eps' from
Feldman, McMillan and Talwar (2021) (:func:`dpsql.local.amplified_epsilon`), printed below.

    python examples/federated_learning.py            # writes benchmarks/federated_learning.png
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

import dpsql.local
from dpsql.local import Reports, Shuffler

Array = npt.NDArray[np.float64]
CLASSES, FEATURES = 4, 12
LEARNING_RATE, LOCAL_STEPS = 0.5, 5
STEP_ALLOWANCE = 0.5  # public: how far one round of local training may move a weight


def make_data(clients: int, per_client: int, test: int, rng: np.random.Generator) -> tuple[Array, Array, Array, Array]:
    """Gaussian classes around random centres; features scaled into [-1, 1]."""
    centres = rng.normal(0, 1.0, (CLASSES, FEATURES))
    def draw(n: int) -> tuple[Array, Array]:
        y = rng.integers(0, CLASSES, n)
        x = centres[y] + rng.normal(0, 1.6, (n, FEATURES))
        return np.clip(x / 4, -1, 1), y
    x, y = draw(clients * per_client)
    x_test, y_test = draw(test)
    return x.reshape(clients, per_client, FEATURES), y.reshape(clients, per_client), x_test, y_test


def softmax(z: Array) -> Array:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]


def local_training(w: Array, b: Array, x: Array, y: Array) -> tuple[Array, Array]:
    """Every client's gradient-descent steps at once: w (clients, F, C), b (clients, C)."""
    onehot = np.eye(CLASSES)[y]
    for _ in range(LOCAL_STEPS):
        p = softmax(np.einsum("knf,kfc->knc", x, w) + b[:, None, :])
        err = (p - onehot) / x.shape[1]
        w = w - LEARNING_RATE * np.einsum("knf,knc->kfc", x, err)
        b = b - LEARNING_RATE * err.sum(axis=1)
    return w, b


def layer_range(layer: Array) -> tuple[float, float]:
    """A layer's (lower, upper) from the public global model: its mean +- (spread + allowance)."""
    c = float(layer.mean())
    r = float(np.abs(layer - c).max()) + STEP_ALLOWANCE
    return c - r, c + r


Sender = Callable[[list[Array], list[tuple[float, float]], float], list[Array]]


def send_plain(layers: list[Array], ranges: list[tuple[float, float]], epsilon: float) -> list[Array]:
    return [layer.mean(axis=0) for layer in layers]


def send_ldp_fl(layers: list[Array], ranges: list[tuple[float, float]], epsilon: float) -> list[Array]:
    """Perturb per layer on the clients, split per parameter, shuffle, average the pools."""
    clients = layers[0].shape[0]
    shuffler = Shuffler(k=clients)
    for index, (layer, (lower, upper)) in enumerate(zip(layers, ranges)):
        reports = dpsql.local.perturb(layer.reshape(clients, -1), lower, upper, epsilon)
        shuffler.submit(Reports("model", f"layer{index}.{p}", f"range{index}", values=reports[:, p])
                        for p in range(reports.shape[1]))
    batch = shuffler.release()
    assert batch is not None
    means = {pool.column: float(pool.values.mean()) for pool in batch.pools}  # type: ignore[union-attr]
    return [np.array([means[f"layer{i}.{p}"] for p in range(layer[0].size)]).reshape(layer.shape[1:])
            for i, layer in enumerate(layers)]


def send_fixed_range(layers: list[Array], ranges: list[tuple[float, float]], epsilon: float) -> list[Array]:
    widest = max(ranges, key=lambda r: r[1] - r[0])
    centre, radius = (widest[0] + widest[1]) / 2, (widest[1] - widest[0]) / 2
    out = []
    for layer in layers:  # one range for all layers, centred at 0 as a global choice would be
        bound = abs(centre) + radius
        out.append(dpsql.local.perturb(layer, -bound, bound, epsilon).mean(axis=0))
    return out


def send_laplace(layers: list[Array], ranges: list[tuple[float, float]], epsilon: float) -> list[Array]:
    rng = np.random.default_rng()  # a simulation of the baseline, not a released mechanism
    out = []
    for layer, (lower, upper) in zip(layers, ranges):
        noisy = np.clip(layer, lower, upper) + rng.laplace(0, (upper - lower) / epsilon, layer.shape)
        out.append(noisy.mean(axis=0))
    return out


SENDERS: dict[str, Sender] = {"non-private": send_plain, "ldp-fl": send_ldp_fl,
                              "fixed-range": send_fixed_range, "laplace": send_laplace}


def train(data: tuple[Array, Array, Array, Array], send: Sender, epsilon: float, rounds: int) -> float:
    x, y, x_test, y_test = data
    clients = x.shape[0]
    w, b = np.zeros((FEATURES, CLASSES)), np.zeros(CLASSES)
    for _ in range(rounds):
        ranges = [layer_range(w), layer_range(b)]
        local_w, local_b = local_training(np.repeat(w[None], clients, 0), np.repeat(b[None], clients, 0), x, y)
        w, b = send([local_w, local_b], ranges, epsilon)
    return float((np.argmax(x_test @ w + b, axis=1) == y_test).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-client", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--plot", default=str(Path(__file__).resolve().parents[1] / "benchmarks" / "federated_learning.png"))
    args = parser.parse_args()
    started = time.perf_counter()
    results: dict[str, dict[float, list[float]]] = {name: {} for name in SENDERS}
    for repeat in range(args.repeats):
        data = make_data(args.clients, args.per_client, 5000, np.random.default_rng(repeat))
        for epsilon in args.epsilons:
            for name, send in SENDERS.items():
                if name == "non-private" and epsilon != args.epsilons[0]:
                    results[name].setdefault(epsilon, []).append(results[name][args.epsilons[0]][repeat])
                    continue
                results[name].setdefault(epsilon, []).append(train(data, send, epsilon, args.rounds))
    parameters = FEATURES * CLASSES + CLASSES
    print(f"{args.clients} clients x {args.per_client} samples, {args.rounds} rounds, {parameters} parameters, "
          f"mean test accuracy of {args.repeats} runs ({time.perf_counter() - started:.0f} s)\n")
    print("| epsilon per report | non-private | ldp-fl (per-layer ranges + shuffling) | fixed range | laplace | "
          "amplified eps' per pool (delta 1e-6) |")
    print("|---|---|---|---|---|---|")
    for epsilon in args.epsilons:
        cells = [f"{np.mean(results[name][epsilon]):.3f}" for name in SENDERS]
        amplified = dpsql.local.amplified_epsilon(epsilon, args.clients, 1e-6)
        print(f"| {epsilon:g} | " + " | ".join(cells) + f" | {amplified:.3g} |")
    plot(results, args.epsilons, args.plot)
    print(f"\nplot: {args.plot}")


def plot(results: dict[str, dict[float, list[float]]], epsilons: list[float], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {"non-private": "k--", "ldp-fl": "o-", "fixed-range": "s-", "laplace": "^-"}
    for name, by_eps in results.items():
        means = [np.mean(by_eps[e]) for e in epsilons]
        ax.plot(epsilons, means, styles[name], label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
    ax.set_xlabel("epsilon per parameter report (local)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Federated softmax regression under local DP")
    ax.axhline(1 / CLASSES, color="grey", lw=0.8, ls=":")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
