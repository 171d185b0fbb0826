#!/usr/bin/env python3
"""Exports torchvision's classification and segmentation models (random weights, random
batch-norm statistics, opset 17) and runs each on primjit's Python package beside onnxruntime:
issue #55's table (largest error over the largest output, median latency on one thread).

usage: torchvision_zoo.py [--out DIR] [--runs N] [--seed S] [--cli PRIMJIT] [--keep]
                          [--dynamic | --dynamo] [MODEL ...]

    MODEL     torchvision model names (default: all of MODELS below); NAME:RUNS gives one
              model its own number of timed runs (vgg16:3)
    --out     where the ONNX files (and inputs and outputs) go (default /tmp/primjit-zoo);
              a file already there is reused, not exported again
    --runs    timed runs of each engine after one warm-up each, the two engines alternated
              (default 5)
    --cli     a `primjit` binary: also run each model that imports with `primjit run`, on the
              same input, and report its output's distance to onnxruntime's
    --keep    keep the ONNX files (by default each is deleted after its row, as the largest
              take 500 MB)
    --dynamic export with symbolic H and W (`NAME.dyn.onnx`) and also run each model at a
              second size, 192x288 (inception_v3: 256x320), against onnxruntime: the row's
              error is the larger of the two
    --dynamo  as --dynamic, exported by torch's dynamo exporter (`dynamo=True`, the default
              from torch 2.9; opset 20; `NAME.dynamo.onnx`), which writes later layers'
              extents as shape arithmetic on `Shape`

Needs torch, torchvision, onnx, onnxruntime, numpy and primjit's package (`cd python &&
maturin develop --release`). A model primjit refuses to import is reported (the first line of
the importer's message, and the op types of the nodes it lists) and the run goes on.

Inputs are 1x3x224x224 (inception_v3: 299x299); the segmentation models return their "out"
output alone, [1, 21, 224, 224].
"""
import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

CLASSIFICATION = [
    "resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2", "vgg11_bn", "vgg16",
    "alexnet", "squeezenet1_0", "squeezenet1_1", "densenet121", "googlenet", "inception_v3",
    "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
    "efficientnet_b3", "mnasnet0_5", "mnasnet1_0", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
    "regnet_x_400mf", "regnet_y_400mf", "regnet_y_1_6gf",
]
SEGMENTATION = [
    "fcn_resnet50", "deeplabv3_resnet50", "deeplabv3_mobilenet_v3_large",
    "lraspp_mobilenet_v3_large",
]
MODELS = CLASSIFICATION + SEGMENTATION
TOLERANCE = 1e-4


def build(name, seed):
    """The model in eval mode: torchvision's random initialization under `seed`, then every
    batch-norm's statistics and affine parameters drawn at random (variance positive), so that
    folding them is exercised rather than the identity."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    if name in SEGMENTATION:
        ctor = getattr(torchvision.models.segmentation, name)
        # weights_backbone defaults to ImageNet weights (a download): none here.
        net = ctor(weights=None, weights_backbone=None)
    else:
        kwargs = {}
        if name in ("googlenet", "inception_v3"):
            # Their default without weights (init_weights=None) warns and means True.
            kwargs["init_weights"] = True
        net = getattr(torchvision.models, name)(weights=None, **kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(c, generator=gen) * 1.0 + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(c, generator=gen) * 1.0 + 0.5)
                    m.bias.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)
    net.eval()
    if name in SEGMENTATION:
        net = OutOnly(net)
    return net


def input_shape(name):
    side = 299 if name == "inception_v3" else 224
    return (1, 3, side, side)


def OutOnly(net):  # noqa: N802 (a module class made once torch is imported)
    import torch

    class _OutOnly(torch.nn.Module):
        """A segmentation model's "out" alone (its forward returns a dict)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)["out"]

    return _OutOnly(net).eval()


def second_shape(name):
    """The other input shape of a `--dynamic` run: neither square nor the export's."""
    return (1, 3, 256, 320) if name == "inception_v3" else (1, 3, 192, 288)


def export(name, path, seed, dynamic=False, dynamo=False):
    import torch

    net = build(name, seed)
    x = torch.zeros(input_shape(name))
    with torch.no_grad():
        if dynamo:
            dim = torch.export.Dim.DYNAMIC
            torch.onnx.export(net, (x,), path, opset_version=20, dynamo=True,
                              input_names=["x"], output_names=["y"],
                              dynamic_shapes={"x": {2: dim, 3: dim}}, external_data=False)
            return
        axes = {"x": {2: "H", 3: "W"}} if dynamic else None
        torch.onnx.export(net, (x,), path, opset_version=17, dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes=axes)


def median_ms(times):
    return statistics.median(times) * 1e3


def import_error_ops(message):
    """The op types of the nodes an importer error lists: `node "NAME" (OP, opset 17): ...`."""
    return re.findall(r'node "[^"]*" \(([A-Za-z0-9_.]+), [^)]*opset \d+\)', message)


def run_one(name, args):
    import onnxruntime
    import primjit

    path = model_path(name, args)
    row = {"model": name}
    t0 = time.perf_counter()
    if not os.path.exists(path):
        export(name, path, args.seed, args.dynamic, args.dynamo)
    row["export_s"] = time.perf_counter() - t0
    row["mb"] = os.path.getsize(path) / 1e6

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal(input_shape(name)).astype(np.float32)

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    ort = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ort_in = ort.get_inputs()[0].name

    engine = primjit.Engine(threads=1, budget="unlimited")
    try:
        model = engine.load(path)
    except primjit.Error as e:
        msg = str(e)
        row["status"] = "import error"
        row["error"] = msg.splitlines()[0] if msg else type(e).__name__
        row["ops"] = import_error_ops(msg)
        row["message"] = msg
        return row

    def run_pj():
        return model(x)

    def run_ort():
        return ort.run(None, {ort_in: x})[0]

    t0 = time.perf_counter()
    y_pj = np.asarray(run_pj())
    row["first_pj_s"] = time.perf_counter() - t0
    y_ort = run_ort()
    if y_pj.shape != y_ort.shape:
        row["status"] = "shape mismatch"
        row["error"] = f"primjit {y_pj.shape}, onnxruntime {y_ort.shape}"
        return row
    scale = float(np.max(np.abs(y_ort)))
    row["max_abs"] = scale
    row["rel"] = float(np.max(np.abs(y_pj.astype(np.float64) - y_ort))) / scale if scale else float("inf")
    row["finite"] = bool(np.all(np.isfinite(y_pj)))
    if args.dynamic:
        # The same model at another size, one import: its error counts too.
        x2 = rng.standard_normal(second_shape(name)).astype(np.float32)
        y2_pj = np.asarray(model(x2))
        y2_ort = ort.run(None, {ort_in: x2})[0]
        if y2_pj.shape != y2_ort.shape:
            row["status"] = "shape mismatch"
            row["error"] = f"at {second_shape(name)}: primjit {y2_pj.shape}, onnxruntime {y2_ort.shape}"
            return row
        scale2 = float(np.max(np.abs(y2_ort)))
        rel2 = float(np.max(np.abs(y2_pj.astype(np.float64) - y2_ort))) / scale2 if scale2 else float("inf")
        row["rel"] = max(row["rel"], rel2)
        row["finite"] = row["finite"] and bool(np.all(np.isfinite(y2_pj)))
    runs = args.per_model_runs.get(name, args.runs)
    t_pj, t_ort = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        run_pj()
        t_pj.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run_ort()
        t_ort.append(time.perf_counter() - t0)
    row["runs"] = runs
    row["pj_ms"] = median_ms(t_pj)
    row["ort_ms"] = median_ms(t_ort)
    row["status"] = "ok" if row["rel"] <= TOLERANCE and row["finite"] else "mismatch"

    if args.cli:
        x_path = os.path.join(args.out, name + ".x.npy")
        y_path = os.path.join(args.out, name + ".cli.npy")
        np.save(x_path, x)
        dims = []
        if args.dynamic:
            # The input's symbols: H and W, or the names the dynamo exporter gives them.
            import onnx

            shape = onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape
            h, w = (shape.dim[i].dim_param for i in (2, 3))
            dims = ["--dims", f"{h}={x.shape[2]},{w}={x.shape[3]}"]
        proc = subprocess.run([args.cli, "run", path, "--input", x_path, "--output", y_path] + dims,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            row["cli"] = "error: " + (proc.stderr.strip().splitlines() or ["?"])[0]
        else:
            y_cli = np.load(y_path).reshape(y_ort.shape)
            cli_rel = float(np.max(np.abs(y_cli.astype(np.float64) - y_ort))) / scale
            same = bool(np.array_equal(y_cli, y_pj))
            row["cli"] = f"{cli_rel:.1e}" + (", same bits as Python" if same else ", differs from Python")
            os.remove(y_path)
        os.remove(x_path)
    return row


def model_path(name, args):
    suffix = ".dynamo.onnx" if args.dynamo else ".dyn.onnx" if args.dynamic else ".onnx"
    return os.path.join(args.out, name + suffix)


def fmt_row(r):
    if r["status"] in ("ok", "mismatch"):
        return (f"| {r['model']} | {r['status']} | {r['rel']:.1e} | {r['pj_ms']:.1f} | "
                f"{r['ort_ms']:.1f} | {r['pj_ms'] / r['ort_ms']:.2f} |")
    ops = ", ".join(sorted(set(r.get("ops", [])))) or r.get("error", "")
    return f"| {r['model']} | {r['status']}: {ops} | | | | |"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--out", default="/tmp/primjit-zoo")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cli")
    ap.add_argument("--keep", action="store_true")
    shapes = ap.add_mutually_exclusive_group()
    shapes.add_argument("--dynamic", action="store_true")
    shapes.add_argument("--dynamo", action="store_true")
    args = ap.parse_args()
    args.dynamic = args.dynamic or args.dynamo
    args.per_model_runs = {}
    names = []
    for m in args.models or MODELS:
        name, _, runs = m.partition(":")
        if name not in MODELS:
            ap.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
        if runs:
            args.per_model_runs[name] = int(runs)
        names.append(name)
    os.makedirs(args.out, exist_ok=True)

    rows = []
    for name in names:
        try:
            r = run_one(name, args)
        except Exception as e:  # noqa: BLE001 (an export or runtime failure is a row too)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            r = {"model": name, "status": "failed", "error": f"{type(e).__name__}: {first}"}
        rows.append(r)
        detail = {k: v for k, v in r.items() if k not in ("message",)}
        print(detail, file=sys.stderr, flush=True)
        if r.get("message"):
            print(r["message"], file=sys.stderr, flush=True)
        if not args.keep:
            path = model_path(name, args)
            if os.path.exists(path):
                os.remove(path)

    print("| model | status | max error / max \\|y\\| | primjit ms | onnxruntime ms | primjit / ort |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(fmt_row(r))
    blockers = collections.Counter()
    models_by_op = collections.defaultdict(list)
    for r in rows:
        for op in sorted(set(r.get("ops", []))):
            models_by_op[op].append(r["model"])
        blockers.update(r.get("ops", []))
    if blockers:
        print()
        print("Op types of the nodes that blocked imports (nodes, models):")
        for op, n in blockers.most_common():
            print(f"- {op}: {n} nodes in {len(models_by_op[op])} models "
                  f"({', '.join(models_by_op[op])})")
    others = [r for r in rows if r["status"] not in ("ok", "mismatch")]
    for r in others:
        print(f"{r['model']}: {r.get('error', '')}")
    if args.cli:
        print()
        for r in rows:
            if "cli" in r:
                print(f"`primjit run` {r['model']}: {r['cli']}")


if __name__ == "__main__":
    main()
