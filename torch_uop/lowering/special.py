"""Special functions that eager evaluates with loops or long rational approximations.

- Orthogonal polynomials with a tensor degree n (Chebyshev T/U/V/W and their shifted forms, Hermite H/He,
  Laguerre L, Legendre P): eager's special cases, then its three-term recurrence with n steps, run by
  `LT.loop` (a kernel loop whose trip count is each element's n), in the computation dtype, op for op.
- gcd / lcm of integers: Euclid's algorithm, also by `LT.loop` (it stops when the remainder is 0).

Nothing here falls back for particular values: every input is computed as eager computes it.
"""
from __future__ import annotations
import math
import torch
from torch_uop.core.dtypes import dtypes
from torch_uop.core.uop import Ops
from torch_uop.lowering.registry import register, Unsupported
from torch_uop.lowering.tensor import LT
from torch_uop.lowering.pointwise import elementwise, INT_TO_FLOAT, DEFAULT

aten = torch.ops.aten


# ---------------------------------------------------------------- orthogonal polynomials

def _degree(n: LT) -> LT:
  """eager's static_cast<int64_t>(n): NaN, inf and out-of-range values give INT64_MIN on x86 (a negative
  degree, which every polynomial maps to 0); -1 stands for them here (LLVM's fptosi would give poison)."""
  if not n.dtype.is_float: return n.cast(dtypes.int64)
  ok = n.math("abs") < 2.0 ** 63
  return ok.where(n, n.const_like(-1.0)).cast(dtypes.int64)


def _recurrence(steps: LT, p: LT, q: LT, step, stop_at_nan: bool) -> LT:
  """Run (p, q) -> (q, step(k, p, q)) for k = 1..steps; eager's loops stop early once q is NaN."""
  def body(k, state):
    p, q = state
    return [q, step(k + 1, p, q)]
  keep_going = (lambda state: state[1].eq(state[1])) if stop_at_nan else None
  return LT.loop(steps, [p, q], body, keep_going)[1]


# kind -> (degree above which |y| < 1 uses the trig form, value at y = 1, value at y = -1 for even n, for odd n)
_CHEBYSHEV = {"t": (6, "1", "1", "-1"), "u": (8, "n+1", "n+1", "-(n+1)"),
              "v": (8, "1", "2n+1", "-(2n+1)"), "w": (8, "2n+1", "1", "-1")}
_SHIFTED_THRESHOLD = {"t": 6, "u": 6, "v": 6, "w": 4}


def _chebyshev(kind: str, shifted: bool):
  """Chebyshev polynomials of the four kinds in y = x (or the shifted y = 2x - 1), as eager: the edge
  values at y = +-1, the trig closed form for large n inside (-1, 1), then the recurrence
  r = 2y q - p from (1, q0) with q0 = y, 2y, 2y - 1, 2y + 1."""
  threshold, at_one, at_minus_even, at_minus_odd = _CHEBYSHEV[kind]
  if shifted: threshold = _SHIFTED_THRESHOLD[kind]

  def f(x: LT, n: LT) -> LT:
    ni = _degree(n)
    nf = ni.cast(x.dtype)
    ints = {"1": nf.const_like(1.0), "-1": nf.const_like(-1.0), "n+1": (ni + 1).cast(x.dtype),
            "-(n+1)": (-(ni + 1)).cast(x.dtype), "2n+1": (ni + ni + 1).cast(x.dtype), "-(2n+1)": (-(ni + ni + 1)).cast(x.dtype)}
    even = (ni & 1).eq(0)
    y = x + x - 1.0 if shifted else x
    if shifted: at_plus, at_minus = x.eq(1.0), x.eq(0.0)
    else: at_plus, at_minus = x.math("abs").eq(1.0) & (x > 0.0), x.math("abs").eq(1.0) & (x <= 0.0)
    edge_minus = even.where(ints[at_minus_even], ints[at_minus_odd])
    theta = y.math("acos")
    if kind == "t": trig = (nf * theta).math("cos")
    elif kind == "u":
      s, m = theta.math("sin"), (ni + 1).cast(x.dtype)
      trig = s.ne(0.0).where((m * theta).math("sin") / s, m * (m * theta).math("cos") / y)
    elif kind == "v":
      trig = (theta / 2.0).math("sin").ne(1.0).where(((nf + 0.5) * theta).math("cos") / (theta / 2.0).math("cos"), edge_minus)
    else:
      at_zero_angle = even.where(ints["1"], ints["-1"]) if shifted else ints["2n+1"]
      trig = (theta / 2.0).math("cos").ne(1.0).where(((nf + 0.5) * theta).math("sin") / (theta / 2.0).math("sin"), at_zero_angle)
    q0 = {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]
    use_trig = (ni > threshold) & (y.math("abs") < 1.0)
    use_edge = at_plus | at_minus
    recur = use_trig.logical_not() & use_edge.logical_not() & (ni >= 2)
    two_y = y + y
    r = _recurrence(recur.where(ni - 1, ni.const_like(0)), nf.const_like(1.0), q0, lambda k, p, q: two_y * q - p, True)
    out = ni.eq(0).where(nf.const_like(1.0), r)   # n == 1 leaves q0 (no step)
    out = use_trig.where(trig, out)
    out = at_minus.where(edge_minus, at_plus.where(ints[at_one], out))
    return (ni < 0).where(nf.const_like(0.0), out)
  return f


def _hermite(physicists: bool):
  """H_n (r = 2x q - 2k p from q = 2x) or He_n (r = x q - k p from q = x); NaN above eager's degree
  limit (128 for float, 512 for double)."""
  def f(x: LT, n: LT) -> LT:
    ni = _degree(n)
    limit = 128 if x.dtype == dtypes.float32 else 512
    q0 = x + x if physicists else x
    if physicists: step = lambda k, p, q: (x + x) * q - (k + k).cast(x.dtype) * p
    else: step = lambda k, p, q: x * q - k.cast(x.dtype) * p
    recur = (ni >= 2) & (ni <= limit)
    r = _recurrence(recur.where(ni - 1, ni.const_like(0)), x.const_like(1.0), q0, step, False)
    out = (ni > limit).where(x.const_like(float("nan")), r)
    out = ni.eq(0).where(x.const_like(1.0), out)
    return (ni < 0).where(x.const_like(0.0), out)
  return f


def _laguerre(x: LT, n: LT) -> LT:
  """L_n: r = ((2k + 1 - x) q - k p) / (k + 1) from q = 1 - x; 1 at x = 0."""
  ni = _degree(n)
  one_minus_x = -x + 1.0
  def step(k, p, q):
    kf = k.cast(x.dtype)
    return (((k + k).cast(x.dtype) + one_minus_x) * q - kf * p) / (k + 1).cast(x.dtype)
  recur = (ni >= 2) & x.math("abs").ne(0.0)
  r = _recurrence(recur.where(ni - 1, ni.const_like(0)), x.const_like(1.0), one_minus_x, step, True)
  out = (ni.eq(0) | x.math("abs").eq(0.0)).where(x.const_like(1.0), r)
  return (ni < 0).where(x.const_like(0.0), out)


def _legendre(x: LT, n: LT) -> LT:
  """P_n: r = ((2k + 1) x q - k p) / (k + 1) from q = x; +-1 at x = +-1."""
  ni = _degree(n)
  def step(k, p, q):
    return ((k + k + 1).cast(x.dtype) * x * q - k.cast(x.dtype) * p) / (k + 1).cast(x.dtype)
  edge = x.math("abs").eq(1.0)
  recur = (ni >= 2) & edge.logical_not()
  r = _recurrence(recur.where(ni - 1, ni.const_like(0)), x.const_like(1.0), x, step, True)
  out = ni.eq(0).where(x.const_like(1.0), r)
  out = edge.where(((x > 0.0) | (ni & 1).eq(0)).where(x.const_like(1.0), x.const_like(-1.0)), out)
  return (ni < 0).where(x.const_like(0.0), out)


def _polynomial(fn):
  def lower(ctx, x, n):
    if ctx.dtype not in (dtypes.float32, dtypes.float64): raise Unsupported("eager has no half-precision kernel")
    return elementwise(ctx, INT_TO_FLOAT, fn, x, n)
  return lower


_POLYNOMIALS = {f"chebyshev_polynomial_{k}": _chebyshev(k, False) for k in "tuvw"}
_POLYNOMIALS.update({f"shifted_chebyshev_polynomial_{k}": _chebyshev(k, True) for k in "tuvw"})
_POLYNOMIALS.update(hermite_polynomial_h=_hermite(True), hermite_polynomial_he=_hermite(False),
                    laguerre_polynomial_l=_laguerre, legendre_polynomial_p=_legendre)
for _name, _fn in _POLYNOMIALS.items():
  register(getattr(aten, "special_" + _name))(_polynomial(_fn))


# ---------------------------------------------------------------- gcd / lcm

def _abs_int(x: LT) -> LT: return x if x.dtype.is_unsigned else (x < 0).where(-x, x)


def _gcd(a: LT, b: LT) -> LT:
  """eager's calc_gcd: a, b = |a|, |b|; while a != 0: a, b = b % a, a. Euclid needs fewer than
  1.45 * bits steps (consecutive Fibonacci numbers are the worst case); the loop stops at a == 0."""
  bits = 8 * a.dtype.itemsize
  count = LT.full(a.shape, 2 * bits + 4, dtypes.int64)
  state = LT.loop(count, [_abs_int(a), _abs_int(b)], lambda k, s: [_safe_mod(s[1], s[0]), s[0]],
                  keep_going=lambda s: s[0].ne(0))
  return state[1]


def _safe_mod(x: LT, y: LT) -> LT:
  """x % y for y != 0 without the hardware trap of INT_MIN % -1 (any x % -1 is 0)."""
  if x.dtype.is_unsigned: return x.alu(Ops.MOD, y)
  return x.alu(Ops.MOD, y.eq(-1).where(y.const_like(1), y))


def _lcm(a: LT, b: LT) -> LT:
  """g = gcd(a, b); 0 if g == 0 else |a / g * b|, in C's int arithmetic (int8/int16 are promoted to int)."""
  wide = dtypes.int32 if a.dtype.itemsize < 4 else a.dtype
  g = _gcd(a, b).cast(wide)
  a, b = a.cast(wide), b.cast(wide)
  # g == -1 happens (gcd(INT_MIN, INT_MAX)): eager traps on INT_MIN / -1; a / -1 is -a (wrapping) here
  safe_g = (g.eq(0) | g.eq(-1)).where(g.const_like(1), g)
  quotient = g.eq(-1).where(-a, a.alu(Ops.IDIV, safe_g))
  return g.eq(0).where(g.const_like(0), _abs_int(quotient * b))


def _integer_binary(fn):
  def lower(ctx, a, b):
    if not ctx.dtype.is_int or ctx.dtype.is_bool: raise Unsupported("gcd/lcm are defined for integers only")
    return elementwise(ctx, DEFAULT, fn, a, b)
  return lower


register(aten.gcd.default)(_integer_binary(_gcd))
register(aten.lcm.default)(_integer_binary(_lcm))


# ---------------------------------------------------------------- Bessel and Airy functions
# Eager's Cephes algorithms, evaluated in the computation dtype op for op (float32 for float32, as eager).
# The rational-approximation coefficients are Cephes' published values.

_AIRY_AI = dict(
    AN=[0.346538101525629, 12.007595273964581, 76.27960536152345, 168.08922493463058, 159.75639135016442, 70.53609068404442, 14.026469116338967, 1.0],
    AD=[0.5675945326387702, 14.75625625848472, 84.51389701414746, 177.31808814540045, 164.2346928715297, 71.47784008255756, 14.095913560783403, 1.0],
    AFN=[-0.1316963234183318, -0.6264565444319123, -0.6931580360369335, -0.2797799815451191, -0.04919001326095003, -0.004062659235948854, -0.0001592764962392621, -2.776491081552329e-06, -1.6778769848911465e-08],
    AFD=[13.356042070655324, 32.682503279522464, 26.736704094149957, 9.187074029072596, 1.4752914677166642, 0.11568717379518804, 0.004402916416152112, 7.547203482874142e-05, 4.5185009297058035e-07],
    AGN=[0.01973399320916857, 0.39110302961568827, 1.0657989759959559, 0.9391692298166502, 0.35146565610554764, 0.06338889196289255, 0.005858041130483885, 0.000282851600836737, 6.98793669997261e-06, 8.117892395543892e-08, 3.415517847659236e-10],
    AGD=[9.30892908077442, 19.835292871831214, 15.564662893286462, 5.476860694229755, 0.9542936116189619, 0.08645808263523921, 0.004126565238242226, 0.00010125908511650914, 1.1716673321441352e-06, 4.9183457006293e-09],
)

_J0 = dict(
    PP=[0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817, 5.303240382353949, 1.0],
    PQ=[0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171, 8.761908832370695, 5.306052882353947, 1.0],
    QP=[-0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683, -177.68116798048806, -147.07750515495118, -51.41053267665993, -6.050143506007285],
    QQ=[64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169, 2062.0933166032783, 242.0057402402914],
    RP=[-4794432209.782018, 1956174919465.5657, -249248344360967.72, 9708622510473064.0],
    RQ=[499.563147152651, 173785.4016763747, 48440965.83399621, 11185553704.535683, 2112775201154.892, 310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18],
)

_J1 = dict(
    PP=[0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076, 8.424045901417724, 5.214515986823615, 1.0],
    PQ=[0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042, 5.209828486823619, 1.0],
    QP=[0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261, 597.4896124006136, 211.68875710057213, 25.207020585802372],
    QQ=[74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507, 2826.1927851763908, 336.0936078106983],
    RP=[-899971225.7055594, 452228297998.19403, -72749424522181.83, 3682957328638529.0],
    RQ=[620.8364781180543, 256987.25675774884, 83514679.14319493, 22151159547.97925, 4749141220799.914, 784369607876235.9, 8.952223361846274e+16, 5.322786203326801e+18],
)

_Y0 = dict(
    PP=[0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817, 5.303240382353949, 1.0],
    PQ=[0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171, 8.761908832370695, 5.306052882353947, 1.0],
    QP=[-0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683, -177.68116798048806, -147.07750515495118, -51.41053267665993, -6.050143506007285],
    QQ=[64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169, 2062.0933166032783, 242.0057402402914],
    YP=[15592.436785523574, -14663929.59039716, 5435264770.518765, -982136065717.9115, 87590639439536.7, -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16],
    YQ=[1041.2835366425984, 626107.330137135, 268919633.39381415, 86400248710.3935, 20297961275010.555, 3171577528429750.5, 2.5059625617265306e+17],
)

_Y1 = dict(
    PP=[0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076, 8.424045901417724, 5.214515986823615, 1.0],
    PQ=[0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042, 5.209828486823619, 1.0],
    QP=[0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261, 597.4896124006136, 211.68875710057213, 25.207020585802372],
    QQ=[74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507, 2826.1927851763908, 336.0936078106983],
    YP=[1263204747.9017804, -647355876379.1603, 114509511541823.73, -8127702555013251.0, 2.024394757135949e+17, -7.788771962659501e+17],
    YQ=[594.3015923461282, 235564.09294306856, 73481194.44597217, 18760131610.870617, 3882312774962.3857, 620557727146953.8, 6.871410873553005e+16, 3.9727060811656064e+18],
)

_I0 = dict(
    A=[-4.4153416464793395e-18, 3.3307945188222384e-17, -2.431279846547955e-16, 1.715391285555133e-15, -1.1685332877993451e-14, 7.676185498604936e-14, -4.856446783111929e-13, 2.95505266312964e-12, -1.726826291441556e-11, 9.675809035373237e-11, -5.189795601635263e-10, 2.6598237246823866e-09, -1.300025009986248e-08, 6.046995022541919e-08, -2.670793853940612e-07, 1.1173875391201037e-06, -4.4167383584587505e-06, 1.6448448070728896e-05, -5.754195010082104e-05, 0.00018850288509584165, -0.0005763755745385824, 0.0016394756169413357, -0.004324309995050576, 0.010546460394594998, -0.02373741480589947, 0.04930528423967071, -0.09490109704804764, 0.17162090152220877, -0.3046826723431984, 0.6767952744094761],
    B=[-7.233180487874754e-18, -4.830504485944182e-18, 4.46562142029676e-17, 3.461222867697461e-17, -2.8276239805165836e-16, -3.425485619677219e-16, 1.7725601330565263e-15, 3.8116806693526224e-15, -9.554846698828307e-15, -4.150569347287222e-14, 1.54008621752141e-14, 3.8527783827421426e-13, 7.180124451383666e-13, -1.7941785315068062e-12, -1.3215811840447713e-11, -3.1499165279632416e-11, 1.1889147107846439e-11, 4.94060238822497e-10, 3.3962320257083865e-09, 2.266668990498178e-08, 2.0489185894690638e-07, 2.8913705208347567e-06, 6.889758346916825e-05, 0.0033691164782556943, 0.8044904110141088],
)

_I1 = dict(
    A=[2.7779141127610464e-18, -2.111421214358166e-17, 1.5536319577362005e-16, -1.1055969477353862e-15, 7.600684294735408e-15, -5.042185504727912e-14, 3.223793365945575e-13, -1.9839743977649436e-12, 1.1736186298890901e-11, -6.663489723502027e-11, 3.625590281552117e-10, -1.8872497517228294e-09, 9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07, -8.568720264695455e-07, 3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05, -0.00016176081582589674, 0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888, -0.010564084894626197, 0.024726449030626516, -0.05294598120809499, 0.1026436586898471, -0.17641651835783406, 0.25258718644363365],
    B=[7.517296310842105e-18, 4.414348323071708e-18, -4.6503053684893586e-17, -3.209525921993424e-17, 2.96262899764595e-16, 3.3082023109209285e-16, -1.8803547755107825e-15, -3.8144030724370075e-15, 1.0420276984128802e-14, 4.272440016711951e-14, -2.1015418427726643e-14, -4.0835511110921974e-13, -7.198551776245908e-13, 2.0356285441470896e-12, 1.4125807436613782e-11, 3.2526035830154884e-11, -1.8974958123505413e-11, -5.589743462196584e-10, -3.835380385964237e-09, -2.6314688468895196e-08, -2.512236237870209e-07, -3.882564808877691e-06, -0.00011058893876262371, -0.009761097491361469, 0.7785762350182801],
)

_K0 = dict(
    A=[1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09, 2.5347910790261494e-07, 2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615, 0.3442898999246285, -0.5353273932339028],
    B=[5.300433772686263e-18, -1.6475804301524212e-17, 5.2103915050390274e-17, -1.678231096805412e-16, 5.512055978524319e-16, -1.848593377343779e-15, 6.3400764774050706e-15, -2.2275133269916698e-14, 8.032890775363575e-14, -2.9800969231727303e-13, 1.140340588208475e-12, -4.514597883373944e-12, 1.8559491149547177e-11, -7.957489244477107e-11, 3.577397281400301e-10, -1.69753450938906e-09, 8.574034017414225e-09, -4.660489897687948e-08, 2.766813639445015e-07, -1.8317555227191195e-06, 1.39498137188765e-05, -0.00012849549581627802, 0.0015698838857300533, -0.0314481013119645, 2.4403030820659555],
)

_K1 = dict(
    A=[-7.023863479386288e-18, -2.427449850519366e-15, -6.666901694199329e-13, -1.4114883926335278e-10, -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052, -0.006975723859639864, -0.12261118082265715, -0.3531559607765449, 1.5253002273389478],
    B=[-5.756744483665017e-18, 1.7940508731475592e-17, -5.689462558442859e-17, 1.838093544366639e-16, -6.057047248373319e-16, 2.038703165624334e-15, -7.019837090418314e-15, 2.4771544244813043e-14, -8.976705182324994e-14, 3.3484196660784293e-13, -1.2891739609510289e-12, 5.13963967348173e-12, -2.1299678384275683e-11, 9.218315187605006e-11, -4.1903547593418965e-10, 2.015049755197033e-09, -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07, 2.406484947837217e-06, -1.936197974166083e-05, 0.00019521551847135162, -0.002857816859622779, 0.10392373657681724, 2.7206261904844427],
)



def _horner(y: LT, coeffs) -> LT:
  """sum c_i y^(n-1-i), from an accumulator of 0 as eager's loops (0 * inf stays NaN)."""
  acc = y.const_like(0.0)
  for c in coeffs: acc = acc * y + c
  return acc


def _chbevl(y: LT, coeffs) -> LT:
  """Clenshaw's sum of a Chebyshev series, as Cephes' chbevl: 0.5 * (b0 - b2)."""
  p, q, a = y.const_like(0.0), y.const_like(0.0), y.const_like(coeffs[0])
  for c in coeffs[1:]: p, q, a = q, a, y * a - q + c
  return (a - p) * 0.5


def _bessel_j_asymptotic(x: LT, t: dict, phase: float, sine: bool, square_first: bool) -> LT:
  """Hankel's expansion for x > 5: sqrt(2/(pi x)) (P cos(x - phase) - 5/x Q sin(x - phase)) for J,
  (P sin + 5/x Q cos) for Y."""
  if square_first: y = x.const_like(25.0) / (x * x)
  else: y = (x.const_like(5.0) / x) * (x.const_like(5.0) / x)
  p = _horner(y, t["PP"]) / _horner(y, t["PQ"])
  q = _horner(y, t["QP"]) / _horner(y, t["QQ"])
  c, s = (x - phase).math("cos"), (x - phase).math("sin")
  five_over_x = x.const_like(5.0) / x
  inner = p * s + five_over_x * q * c if sine else p * c - five_over_x * q * s
  return inner * 0.797884560802865355879892119868763737 / x.sqrt()


_QUARTER_PI, _THREE_QUARTER_PI, _TWO_OVER_PI = 0.785398163397448309615660845819875721, 2.356194490192344928846982537459627163, 0.636619772367581343075535053490057448


def _j0(x: LT) -> LT:
  x = (x < 0.0).where(-x, x)
  xx = x * x
  small = (xx - 5.78318596294678452118e+00) * (xx - 3.04712623436620863991e+01) * _horner(xx, _J0["RP"]) / _horner(xx, _J0["RQ"])
  small = (x < 0.00001).where(-(xx / 4.0) + 1.0, small)
  return (x <= 5.0).where(small, _bessel_j_asymptotic(x, _J0, _QUARTER_PI, False, True))


def _j1(x: LT) -> LT:
  neg = x < 0.0
  x = neg.where(-x, x)
  xx = x * x
  small = _horner(xx, _J1["RP"]) / _horner(xx, _J1["RQ"]) * x * (xx - 1.46819706421238932572e+01) * (xx - 4.92184563216946036703e+01)
  out = (x <= 5.0).where(small, _bessel_j_asymptotic(x, _J1, _THREE_QUARTER_PI, False, False))
  return neg.where(-out, out)


def _y0(x: LT) -> LT:
  xx = x * x
  small = _horner(xx, _Y0["YP"]) / _horner(xx, _Y0["YQ"]) + x.log() * _TWO_OVER_PI * _j0(x)
  small = x.eq(0.0).where(x.const_like(-math.inf), (x < 0.0).where(x.const_like(math.nan), small))
  return (x <= 5.0).where(small, _bessel_j_asymptotic(x, _Y0, _QUARTER_PI, True, True))


def _y1(x: LT) -> LT:
  xx = x * x
  small = x * (_horner(xx, _Y1["YP"]) / _horner(xx, _Y1["YQ"])) + (_j1(x) * x.log() - x.recip()) * _TWO_OVER_PI
  small = x.eq(0.0).where(x.const_like(-math.inf), (x < 0.0).where(x.const_like(math.nan), small))
  return (x <= 5.0).where(small, _bessel_j_asymptotic(x, _Y1, _THREE_QUARTER_PI, True, False))


def _modified_bessel_k(order: int, scaled: bool):
  """K0/K1 (scaled: times e^x) as eager: a Chebyshev series in x^2 - 2 plus the I0/I1 log term for x <= 2,
  a Chebyshev series in 8/x - 2 beyond."""
  t = _K0 if order == 0 else _K1

  def f(x: LT) -> LT:
    a_term = _chbevl(x * x - 2.0, t["A"])
    # eager's I0/I1 for |x| <= 8 (only x <= 2 reads it)
    ax = x.math("abs")
    i_series = _chbevl(ax / 2.0 - 2.0, (_I0 if order == 0 else _I1)["A"])
    i_value = ax.exp() * i_series if order == 0 else i_series * ax * ax.exp()
    if order == 0 and not scaled and x.dtype == dtypes.float32:
      # eager's std::log(0.5 * x): 0.5 is a double literal, so this term is computed in double
      wide = a_term.cast(dtypes.float64) - (x.cast(dtypes.float64) * 0.5).log() * i_value.cast(dtypes.float64)
      small = wide.cast(x.dtype)
    elif order == 0: small = a_term - (x * 0.5).log() * i_value
    else: small = (x * 0.5).log() * i_value + a_term / x
    if scaled: small = small * x.exp()
    b_term = _chbevl(x.const_like(8.0) / x - 2.0, t["B"])
    large = b_term / x.sqrt() if scaled else (-x).exp() * b_term / x.sqrt()
    out = (x <= 2.0).where(small, large)
    return x.eq(0.0).where(x.const_like(math.inf), (x < 0.0).where(x.const_like(math.nan), out))
  return f


def _airy_ai(x: LT) -> LT:
  """Ai as eager: asymptotic rational forms for x < -2.09 and x >= 2.09, the Maclaurin series (a loop
  until the term falls below epsilon, as eager's) in between."""
  eps = 2.220446049250313e-16 if x.dtype == dtypes.float64 else 1.1920928955078125e-07
  # x < -2.09
  neg_root = (-x).sqrt()
  zeta_neg = x * -2.0 * neg_root / 3.0
  z = zeta_neg.recip()
  zz = z * z
  t = zeta_neg + x.const_like(math.pi) * 0.25
  osc = (t.math("sin") * (zz * _horner(zz, _AIRY_AI["AFN"]) / _horner(zz, _AIRY_AI["AFD"]) + 1.0)
         - t.math("cos") * (z * _horner(zz, _AIRY_AI["AGN"]) / _horner(zz, _AIRY_AI["AGD"])))
  left = x.const_like(5.64189583547756286948e-01) / neg_root.sqrt() * osc
  # x >= 2.09
  zeta = x * 2.0 * x.sqrt() / 3.0
  rz = zeta.recip()
  right = x.const_like(5.64189583547756286948e-01) * (_horner(rz, _AIRY_AI["AN"]) / _horner(rz, _AIRY_AI["AD"])) / (x.sqrt().sqrt() * 2.0 * zeta.exp())
  # the series in between: f = sum z^k / ..., g = x sum ...; it converges in under 100 steps for |x| < 2.09
  # (the terms fall like 9.2^k / (3k)!); after that the terms are 0 and |m / f| is 0 or NaN
  middle_region = (x >= -2.09) & (x < 2.09)
  cube = x * x * x
  def step(_, s):
    f, g, k, m, n, _t = s
    m = m * cube; k = k + 1.0; m = m / k
    n = n * cube; k = k + 1.0; n = n / k
    m = m / k; f = f + m
    k = k + 1.0; n = n / k; g = g + n
    return [f, g, k, m, n, (m / f).math("abs")]
  one = x.const_like(1.0)
  count = middle_region.where(LT.full(x.shape, 128, dtypes.int64), LT.full(x.shape, 0, dtypes.int64))
  f, g, *_ = LT.loop(count, [one, x, one, one, x, one], step, keep_going=lambda s: s[5] > eps)
  series = f * 0.355028053887817239260 - g * 0.258819403792806798405
  out = (x < -2.09).where(left, (x >= 2.09).where(right, series))
  out = (x > 103.892).where(x.const_like(0.0), out)
  return x.math("abs").eq(math.inf).where(x.const_like(math.nan), out)


def _unary_special(fn):
  def lower(ctx, a):
    if ctx.dtype not in (dtypes.float32, dtypes.float64): raise Unsupported("eager has no half-precision kernel")
    return elementwise(ctx, INT_TO_FLOAT, fn, a)
  return lower


for _op, _fn in {"special_bessel_j0": _j0, "special_bessel_j1": _j1, "special_bessel_y0": _y0, "special_bessel_y1": _y1,
                 "special_modified_bessel_k0": _modified_bessel_k(0, False), "special_modified_bessel_k1": _modified_bessel_k(1, False),
                 "special_scaled_modified_bessel_k0": _modified_bessel_k(0, True),
                 "special_scaled_modified_bessel_k1": _modified_bessel_k(1, True), "special_airy_ai": _airy_ai}.items():
  register(getattr(aten, _op))(_unary_special(_fn))
