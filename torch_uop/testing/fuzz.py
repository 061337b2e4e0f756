"""A differential fuzzer: random tensor programs from a seed, run by eager and by torch.compile(backend="uop"),
their results compared.

`program(seed)` draws a `Program`: 1-3 inputs (random shapes of rank 1-4 and sizes 1-9, dtype float32, float64,
int64 or bool, some made non-contiguous by a transpose or a strided slice, floats salted with NaN, +-Inf, -0.0
and large values) and 2-8 steps, each an op from OPS applied to tensors of the pool: elementwise unary and binary
ops with broadcasting, comparisons and where, reductions (sum, amax, amin, mean, prod, argmax, softmax,
logsumexp, cumsum), movement (permute, reshape, flip, strided slice, expand, cat, pad, unsqueeze), matmul,
and indexing (index_select, gather, advanced indexing with in-range index tensors). The last step's result and
up to two others are the outputs. `check(seed)` compiles the program and asserts eager's values (NaN where eager
has NaN; floats within a tolerance scaled by the result's magnitude; or, element by element, the values of the
program run by eager in float64), or eager's exception type.

  python -m torch_uop.testing.fuzz --seeds 0:500     # a longer run than the test suite's
"""
from __future__ import annotations
import argparse
import random
import sys
from dataclasses import dataclass, field
import torch

FLOATS = (torch.float32, torch.float64)


@dataclass
class Program:
  seed: int
  inputs: list                                  # torch tensors
  steps: list = field(default_factory=list)     # (op name, argument pool indices, params)
  outputs: tuple = ()                           # pool indices

  def run(self, *inputs):
    pool = list(inputs)
    for name, args, params in self.steps: pool.append(OPS[name][1](*[pool[i] for i in args], **params))
    return tuple(pool[i] for i in self.outputs)

  def describe(self) -> str:
    ins = ", ".join(f"{tuple(t.shape)}{'' if t.is_contiguous() else ' strided'} {str(t.dtype)[6:]}" for t in self.inputs)
    n = len(self.inputs)
    show = lambda v: v.tolist() if isinstance(v, torch.Tensor) else v
    body = "; ".join(f"t{n + k} = {name}({', '.join(f't{i}' for i in args)}{''.join(f', {p}={show(v)!r}' for p, v in params.items())})"
                     for k, (name, args, params) in enumerate(self.steps))
    return f"seed {self.seed}: inputs {ins}; {body}; outputs {', '.join(f't{i}' for i in self.outputs)}"


# ----- inputs -----

def _special_floats(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
  flat = t.reshape(-1)
  for _ in range(rng.randint(0, 3)):
    if flat.numel(): flat[rng.randrange(flat.numel())] = rng.choice([float("nan"), float("inf"), -float("inf"), -0.0, 1e4, -3e3])
  return t


def _input(rng: random.Random, shape: tuple, dtype) -> torch.Tensor:
  g = torch.Generator().manual_seed(rng.randrange(1 << 30))
  if dtype is torch.bool: t = torch.rand(shape, generator=g) > 0.5
  elif dtype is torch.int64: t = torch.randint(-9, 10, shape, generator=g)
  else: t = _special_floats((torch.randn(shape, generator=g) * rng.choice([1.0, 3.0])).to(dtype), rng)
  r = rng.random()
  if len(shape) >= 2 and r < 0.2:  # the same values, transposed in memory
    t = t.transpose(0, 1).contiguous().transpose(0, 1)
  elif shape and r < 0.35:  # a strided slice of a bigger tensor
    big = torch.zeros((shape[0] * 2,) + shape[1:], dtype=dtype)
    big[::2] = t
    t = big[::2]
  return t


def _shape(rng: random.Random) -> tuple:
  return tuple(rng.choice([1, 2, 3, 4, 5, 7, 8, 9]) for _ in range(rng.randint(1, 4)))


def _broadcastable_to(rng: random.Random, shape: tuple) -> tuple:
  """A shape that broadcasts against `shape`: some dims set to 1, maybe fewer leading dims."""
  out = [1 if rng.random() < 0.3 else s for s in shape]
  return tuple(out[rng.randint(0, max(len(out) - 1, 0)):]) if rng.random() < 0.3 else tuple(out)


# ----- ops: name -> (applies(rng, tensors) -> (argument choice, params) | None, fn) -----

def _float(t): return t.dtype in FLOATS
def _num(t): return t.dtype is not torch.bool


def _dim(rng, t): return rng.randrange(t.ndim) if t.ndim else None


UNARY = {
  "neg": (_num, torch.neg), "abs": (_num, torch.abs), "exp": (_float, torch.exp), "log": (_float, torch.log),
  "sqrt": (_float, torch.sqrt), "tanh": (_float, torch.tanh), "sigmoid": (_float, torch.sigmoid), "relu": (_num, torch.relu),
  "sin": (_float, torch.sin), "floor": (_float, torch.floor), "reciprocal": (_float, torch.reciprocal),
  "erf": (_float, torch.erf), "gelu": (_float, torch.nn.functional.gelu), "rsqrt": (_float, torch.rsqrt),
  "logical_not": (lambda t: True, torch.logical_not), "isnan": (_float, torch.isnan), "sign": (_num, torch.sign),
  "square": (_num, torch.square), "to_float": (lambda t: True, lambda t: t.to(torch.float32)),
}
BINARY = {
  "add": (_num, torch.add), "sub": (_num, torch.sub), "mul": (_num, torch.mul), "div": (_float, torch.div),
  "maximum": (_num, torch.maximum), "minimum": (_num, torch.minimum), "gt": (_num, torch.gt), "eq": (lambda t: True, torch.eq),
  "atan2": (_float, torch.atan2), "logical_and": (lambda t: True, torch.logical_and), "pow": (_float, torch.pow),
  "fmod": (_float, torch.fmod), "floor_divide_int": (lambda t: t.dtype is torch.int64,
                                                     lambda a, b: torch.floor_divide(a, b.abs() + 1)),
}

OPS: dict = {}
for _name, (_ok, _fn) in UNARY.items(): OPS[_name] = (("unary", _ok), _fn)
for _name, (_ok, _fn) in BINARY.items(): OPS[_name] = (("binary", _ok), _fn)
OPS.update({
  "where": (("where", _num), lambda c, a, b: torch.where(c, a, b)),
  "sum": (("reduce", _num), lambda t, dim, keepdim: t.sum(dim, keepdim=keepdim)),
  "amax": (("reduce", _num), lambda t, dim, keepdim: t.amax(dim, keepdim=keepdim)),
  "amin": (("reduce", _num), lambda t, dim, keepdim: t.amin(dim, keepdim=keepdim)),
  "mean": (("reduce", _float), lambda t, dim, keepdim: t.mean(dim, keepdim=keepdim)),
  "prod": (("reduce", _num), lambda t, dim, keepdim: t.prod(dim, keepdim=keepdim)),
  "argmax": (("reduce", _num), lambda t, dim, keepdim: t.argmax(dim, keepdim=keepdim)),
  "softmax": (("dim", _float), lambda t, dim: torch.softmax(t, dim)),
  "logsumexp": (("dim", _float), lambda t, dim: torch.logsumexp(t, dim)),
  "cumsum": (("dim", _num), lambda t, dim: torch.cumsum(t, dim)),
  "permute": (("permute", lambda t: True), lambda t, order: t.permute(order)),
  "flatten": (("any", lambda t: True), lambda t: t.reshape(-1)),
  "flip": (("dim", lambda t: True), lambda t, dim: t.flip(dim)),
  "slice": (("slice", lambda t: True), lambda t, dim, start, step: t.narrow(dim, start, t.shape[dim] - start)[(slice(None),) * dim + (slice(None, None, step),)]),
  "expand": (("expand", lambda t: True), lambda t, shape: t.expand(shape)),
  "cat": (("cat", lambda t: True), lambda a, b, dim: torch.cat([a, b.to(a.dtype)], dim)),
  "pad": (("dim", _num), lambda t, dim: torch.nn.functional.pad(t.movedim(dim, -1), (1, 2)).movedim(-1, dim)),
  "unsqueeze": (("any", lambda t: True), lambda t: t.unsqueeze(0)),
  "matmul": (("matmul", _float), lambda a, b: a @ b.to(a.dtype)),
  "index_select": (("index_select", lambda t: True), lambda t, dim, index: t.index_select(dim, index)),
  "gather": (("gather", lambda t: True), lambda t, dim, index: torch.gather(t, dim, index)),
  "index": (("index", lambda t: True), lambda t, dim, index: t[(slice(None),) * dim + (index,)]),
})


def _params(rng: random.Random, kind: str, pool: list, eligible) -> tuple | None:
  """(argument indices, params) for an op of `kind` on tensors of the pool, or None when none fits."""
  cands = [i for i, t in enumerate(pool) if eligible(t)]
  if not cands: return None
  i = rng.choice(cands[-2:] if rng.random() < 0.6 else cands)  # mostly the newest: chains of ops to fuse
  t = pool[i]
  if kind in ("unary", "any"): return [i], {}
  if kind == "binary":
    same = [j for j in cands if _broadcasts(pool[j].shape, t.shape) and pool[j].dtype == t.dtype]
    return [i, rng.choice(same)], {}
  if kind == "where":
    conds = [j for j, c in enumerate(pool) if c.dtype is torch.bool and _broadcasts(c.shape, t.shape)]
    others = [j for j in cands if pool[j].dtype == t.dtype and _broadcasts(pool[j].shape, t.shape)]
    if not conds: return None
    return [rng.choice(conds), i, rng.choice(others)], {}
  if t.ndim == 0: return None
  dim = _dim(rng, t)
  if kind == "reduce": return [i], {"dim": dim, "keepdim": rng.random() < 0.5}
  if kind == "dim": return [i], {"dim": dim}
  if kind == "permute":
    order = list(range(t.ndim))
    rng.shuffle(order)
    return [i], {"order": tuple(order)}
  if kind == "slice": return [i], {"dim": dim, "start": rng.randrange(t.shape[dim]), "step": rng.choice([1, 2, 3])}
  if kind == "expand":
    if 1 not in t.shape: return None
    return [i], {"shape": tuple(rng.choice([2, 3, 5]) if s == 1 else s for s in t.shape)}
  if kind == "cat":
    fits = [j for j, u in enumerate(pool) if u.shape[:dim] + u.shape[dim + 1:] == t.shape[:dim] + t.shape[dim + 1:]
            and u.ndim == t.ndim and u.dtype != torch.bool and t.dtype != torch.bool]
    return ([i, rng.choice(fits)], {"dim": dim}) if fits else None
  if kind == "matmul":
    if t.ndim != 2: return None
    fits = [j for j, u in enumerate(pool) if u.ndim == 2 and u.shape[0] == t.shape[1] and _float(u)]
    return ([i, rng.choice(fits)], {}) if fits else None
  if kind in ("index", "index_select", "gather"):
    n = t.shape[dim]
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    if kind == "gather":
      shape = tuple(rng.randint(1, s) if d != dim else rng.randint(1, 6) for d, s in enumerate(t.shape))
      return [i], {"dim": dim, "index": torch.randint(0, n, shape, generator=g)}
    wrap = rng.random() < 0.5
    low = -n if wrap and kind == "index" else 0  # advanced indexing wraps negative indices (index_select does not)
    return [i], {"dim": dim, "index": torch.randint(low, n, (rng.randint(1, 6),), generator=g)}
  raise ValueError(kind)


def _broadcasts(a: tuple, b: tuple) -> bool:
  """a broadcasts to b without changing b's shape."""
  return len(a) <= len(b) and all(x == y or x == 1 for x, y in zip(reversed(a), reversed(b)))


def program(seed: int) -> Program:
  rng = random.Random(seed)
  base = _shape(rng)
  dtypes = [rng.choice([torch.float32, torch.float32, torch.float64, torch.int64, torch.bool]) for _ in range(rng.randint(1, 3))]
  inputs = [_input(rng, base if k == 0 else _broadcastable_to(rng, base), dt) for k, dt in enumerate(dtypes)]
  prog = Program(seed, inputs)
  pool = [t.clone() for t in inputs]
  names = sorted(OPS)
  for _ in range(rng.randint(3, 10)):
    for _attempt in range(20):
      name = rng.choice(names)
      (kind, eligible), fn = OPS[name]
      chosen = _params(rng, kind, pool, eligible)
      if chosen is None: continue
      args, params = chosen
      try: out = fn(*[pool[i] for i in args], **params)
      except (RuntimeError, ValueError, IndexError, TypeError): continue
      if not isinstance(out, torch.Tensor) or out.numel() > 4096 or out.numel() == 0: continue
      pool.append(out)
      prog.steps.append((name, args, params))
      break
  last = len(pool) - 1
  others = [i for i in range(len(inputs), last)]
  prog.outputs = (last,) + tuple(rng.sample(others, min(len(others), rng.randint(0, 2))))
  return prog


# ----- comparing -----

def _matches(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
  """Per element: actual equals expected (NaN where it has NaN, the same infinities, floats within a tolerance
  scaled by the element and by the result's largest finite magnitude)."""
  if not expected.dtype.is_floating_point: return actual == expected
  e, a = expected.double(), actual.double()
  fin = e.isfinite()
  scale = e[fin].abs().max() if fin.any() else torch.tensor(0.0, dtype=torch.float64)
  tol = 1e-4 if expected.dtype is torch.float32 else 1e-9
  close = (a - e).abs() <= tol * (1 + e.abs()) + tol * scale
  return torch.where(fin, close & a.isfinite(), (a == e) | (a.isnan() & e.isnan()))


def _mismatch(actual: torch.Tensor, expected: torch.Tensor, wider: torch.Tensor | None) -> str | None:
  """Why actual is not eager's result, or None. An element may instead match `wider`, the program run by eager in
  float64 and rounded back: eager's float32 kernels disagree among themselves at some edges (its vectorized gelu
  gives NaN at +inf where its scalar path and float64 give inf), and the compiled program may take either side."""
  if actual.shape != expected.shape or actual.dtype != expected.dtype:
    return f"shape/dtype {tuple(actual.shape)} {actual.dtype} != eager {tuple(expected.shape)} {expected.dtype}"
  ok = _matches(actual, expected)
  if wider is not None and wider.shape == expected.shape: ok |= _matches(actual, wider.to(expected.dtype))
  if bool(ok.all()): return None
  bad = (~ok).nonzero()[0].tolist()
  return f"at {bad}: {actual[tuple(bad)].item()!r}, eager {expected[tuple(bad)].item()!r}"


def _widened(t: torch.Tensor) -> torch.Tensor: return t.double() if t.dtype is torch.float32 else t.clone()


def check(seed: int, options: dict | None = None) -> Program:
  """Compile seed's program with backend="uop" and compare with eager; raises AssertionError with the program."""
  prog = program(seed)
  torch._dynamo.reset()
  compiled = torch.compile(prog.run, backend="uop", dynamic=False, options={"graph_cache": False, **(options or {})})
  try: expected = prog.run(*[t.clone() for t in prog.inputs])
  except Exception as e:
    try: compiled(*[t.clone() for t in prog.inputs])
    except type(e): return prog
    raise AssertionError(f"eager raised {type(e).__name__} but the compiled program did not: {prog.describe()}")
  actual = compiled(*[t.clone() for t in prog.inputs])
  try: wider = prog.run(*[_widened(t) for t in prog.inputs])
  except Exception: wider = [None] * len(expected)
  for k, (a, e, w) in enumerate(zip(actual, expected, wider)):
    if (problem := _mismatch(a, e, w)) is not None:
      raise AssertionError(f"output {k}: {problem}: {prog.describe()}")
  return prog


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description="differential fuzzing of backend='uop' against eager")
  ap.add_argument("--seeds", default="0:200", help="a range lo:hi")
  args = ap.parse_args(argv)
  lo, hi = map(int, args.seeds.split(":"))
  failed = 0
  for seed in range(lo, hi):
    try: check(seed)
    except AssertionError as e:
      failed += 1
      print(f"MISMATCH {e}", flush=True)
    except Exception as e:  # a crash of the compiled call where eager worked
      failed += 1
      print(f"ERROR seed {seed}: {type(e).__name__}: {str(e)[:300]}: {program(seed).describe()}", flush=True)
  print(f"{hi - lo} programs, {failed} mismatches")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
