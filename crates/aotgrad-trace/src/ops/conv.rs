//! Convolution and pooling over 2-D images.
//!
//! `conv2d`, `conv_transpose2d` (the convolution's input gradient) and `max_pool2d` of
//! float images are core ops (`Op::Conv2d`, `Op::Conv2dInputGrad`, `Op::MaxPool2d`,
//! whose gradients are core ops too): the backends run them as im2col GEMMs and
//! window loops. The rest are decompositions that gather the `kh * kw` window taps as
//! strided slices of the (padded) input, `x[:, :, i*dh :: sh, j*dw :: sw]`, each a
//! view of `[N, C, OH, OW]` (no overlapping views, so every gradient flows through the
//! slices' own rule):
//! - `avg_pool2d`, and `max_pool2d` of integer images, combine the taps elementwise (no
//!   stack: one fused pointwise kernel): their mean, or their first maximum, so that
//!   the gradient goes to that one element as PyTorch's indices send it;
//! - `conv_transpose2d` with an output padding of at least its stride (allowed when the
//!   dilation is larger) adds one matmul's per-tap contributions into strided windows
//!   of the output.

use crate::error::{Error, Result};
use crate::ops::dispatch;
use crate::tensor::Tensor;
use aotgrad_ir::Dims;
use aotgrad_ir::{Conv2dParams, Dim, Op, Pool2dParams, SourceLoc};

/// A 2-D convolution's or pooling's geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOpts {
    /// Step between windows (rows, columns).
    pub stride: [usize; 2],
    /// Zeros (or, for max pooling, -inf) added on each side (rows, columns).
    pub padding: [usize; 2],
    /// Step between a window's taps (rows, columns).
    pub dilation: [usize; 2],
    /// Channel groups (convolution only).
    pub groups: usize,
}

impl Default for Conv2dOpts {
    /// PyTorch's defaults: stride 1, no padding, no dilation, one group.
    fn default() -> Self {
        Conv2dOpts { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1 }
    }
}

impl Conv2dOpts {
    /// With `stride`.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = [s, s];
        self
    }
    /// With `padding` on every side.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = [p, p];
        self
    }
    /// With `dilation`.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = [d, d];
        self
    }
    /// With `groups`.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
}

fn bad(op: &str, loc: &SourceLoc, msg: String) -> Error {
    Error::invalid(op, loc, msg)
}

fn shape_text(t: &Tensor) -> String {
    let s: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!("[{}]", s.join(", "))
}

/// Concrete spatial sizes of a 4-D input.
fn spatial(op: &str, x: &Tensor, loc: &SourceLoc) -> Result<[usize; 2]> {
    let hw = [x.size(2)?.as_const(), x.size(3)?.as_const()];
    match hw {
        [Some(h), Some(w)] => Ok([h as usize, w as usize]),
        _ => Err(bad(
            op,
            loc,
            format!("needs concrete image sizes, got {} (batch and channels may be symbolic)", shape_text(x)),
        )),
    }
}

/// The core ops' parameters of `opts`.
fn conv_params(o: &Conv2dOpts) -> Conv2dParams {
    Conv2dParams { stride: o.stride, padding: o.padding, dilation: o.dilation, groups: o.groups }
}

/// `(OH, OW)` of a `k` window sliding over `x` `[N, C, H, W]`, or the error naming
/// the geometry that does not fit.
fn window_sizes(op: &str, x: &Tensor, k: [usize; 2], o: &Conv2dOpts, loc: &SourceLoc) -> Result<[usize; 2]> {
    if o.stride.contains(&0) || o.dilation.contains(&0) || k.contains(&0) {
        return Err(bad(
            op,
            loc,
            format!("kernel {k:?}, stride {:?} and dilation {:?} must be positive", o.stride, o.dilation),
        ));
    }
    let [h, w] = spatial(op, x, loc)?;
    let mut out = [0usize; 2];
    for (a, (size, kk)) in [h, w].into_iter().zip(k).enumerate() {
        let span = o.dilation[a] * (kk - 1) + 1;
        let padded = size + 2 * o.padding[a];
        if padded < span {
            return Err(bad(
                op,
                loc,
                format!(
                    "input {} is smaller than the kernel: padded size {padded} < dilated kernel size {span} in dim {}",
                    shape_text(x),
                    a + 2
                ),
            ));
        }
        out[a] = (padded - span) / o.stride[a] + 1;
    }
    Ok(out)
}

/// The `kh * kw` window taps of `x` `[N, C, H, W]`, each a strided view `[N, C, OH,
/// OW]` of the padded input, in row-major window order, and `(OH, OW)`.
fn taps(
    op: &str,
    x: &Tensor,
    k: [usize; 2],
    o: &Conv2dOpts,
    pad: f64,
    loc: &SourceLoc,
) -> Result<(Vec<Tensor>, [usize; 2])> {
    let out = window_sizes(op, x, k, o, loc)?;
    // Padding: concatenate constant blocks on both sides of dims 2 and 3.
    let mut xp = x.clone();
    for a in 0..2 {
        let p = o.padding[a];
        if p == 0 {
            continue;
        }
        let mut blk: Dims = xp.shape().into();
        blk[a + 2] = Dim::Const(p as i64);
        let side = Tensor::full_dims(&blk, pad, xp.dtype())?;
        xp = Tensor::cat(&[&side, &xp, &side], (a + 2) as i64)?;
    }
    let mut parts = Vec::with_capacity(k[0] * k[1]);
    for i in 0..k[0] {
        for j in 0..k[1] {
            let (r0, c0) = (i * o.dilation[0], j * o.dilation[1]);
            let r1 = r0 + o.stride[0] * (out[0] - 1) + 1;
            let c1 = c0 + o.stride[1] * (out[1] - 1) + 1;
            let s = xp.slice(2, Some(r0 as i64), Some(r1 as i64), o.stride[0] as i64)?;
            parts.push(s.slice(3, Some(c0 as i64), Some(c1 as i64), o.stride[1] as i64)?);
        }
    }
    Ok((parts, out))
}

/// The elementwise maximum of the taps, computed so that its gradient goes to one
/// tap only, the one PyTorch's max-pooling indices pick: the first tap equal to the
/// maximum, or, when the window holds a NaN (which is then the maximum), the last
/// NaN. The value is the sum of `where(selected, tap, 0)` over the taps, one selected
/// per element. All pointwise: one fused kernel over the taps' strided views.
fn first_max(taps: &[Tensor]) -> Result<Tensor> {
    let mut m = taps[0].clone();
    for t in &taps[1..] {
        m = m.maximum(t)?;
    }
    let flag = if taps[0].dtype().is_float() { taps[0].dtype() } else { aotgrad_ir::DType::F32 };
    // Per tap, as 0 / 1 flags: selected among the equal ones (first), among the NaNs (last).
    let first = |hits: Vec<Tensor>| -> Result<Vec<Tensor>> {
        let mut found: Option<Tensor> = None;
        let mut sel = Vec::with_capacity(hits.len());
        for h in hits {
            sel.push(match &found {
                None => h.clone(),
                Some(f) => h.mul(&f.rsub(1.0)?)?,
            });
            found = Some(match found {
                None => h,
                Some(f) => f.maximum(&h)?,
            });
        }
        Ok(sel)
    };
    let eq: Vec<Tensor> = taps.iter().map(|t| t.eq(&m)?.to(flag)).collect::<Result<_>>()?;
    let mut nan: Vec<Tensor> = taps.iter().rev().map(|t| t.ne(t)?.to(flag)).collect::<Result<_>>()?;
    let sel_eq = first(eq)?;
    nan = first(nan)?;
    nan.reverse();
    let m_nan = m.ne(&m)?.to(flag)?;
    let mut value: Option<Tensor> = None;
    for (k, t) in taps.iter().enumerate() {
        let sel = sel_eq[k].mul(&m_nan.rsub(1.0)?)?.add(&nan[k].mul(&m_nan)?)?;
        let take = Tensor::where_(&sel.gt(0.5)?, t, &t.zeros_like()?)?;
        value = Some(match value {
            None => take,
            Some(v) => v.add(&take)?,
        });
    }
    Ok(value.unwrap_or(m))
}

/// `x` as a batch of images: 4-D as is, 3-D `[C, H, W]` as a batch of one.
fn batched(op: &str, x: &Tensor, loc: &SourceLoc) -> Result<(Tensor, bool)> {
    match x.dim() {
        4 => Ok((x.clone(), false)),
        3 => Ok((x.unsqueeze(0)?, true)),
        r => Err(bad(op, loc, format!("expected a 3-D or 4-D input, got {r}-D {}", shape_text(x)))),
    }
}

fn unbatched(y: Tensor, squeeze: bool) -> Result<Tensor> {
    if squeeze {
        y.squeeze_dim(0)
    } else {
        Ok(y)
    }
}

/// **Convolution and pooling** over `[N, C, H, W]` images: `conv2d`,
/// `conv_transpose2d`, `max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d`.
///
/// ```
/// # use aotgrad_trace::{DType, Tensor};
/// use aotgrad_trace::Conv2dOpts;
/// let img = Tensor::ones(&[1, 1, 4, 4], DType::F64)?;
/// let k = Tensor::ones(&[2, 1, 3, 3], DType::F64)?;
/// let y = img.conv2d(&k, None, Conv2dOpts::default().padding(1))?;
/// assert_eq!(y.sizes()?, vec![1, 2, 4, 4]);
/// assert_eq!(y.to_vec_f64()?[..4], [4.0, 6.0, 6.0, 4.0]);
/// assert_eq!(img.max_pool2d([2, 2], None, [0, 0], [1, 1])?.sizes()?, vec![1, 1, 2, 2]);
/// # Ok::<(), aotgrad_trace::Error>(())
/// ```
impl Tensor {
    /// 2-D convolution (PyTorch's `conv2d`): `self` `[N, C, H, W]` (or `[C, H, W]`),
    /// `weight` `[OC, C / groups, KH, KW]`, optional `bias` `[OC]`; the result is
    /// `[N, OC, OH, OW]` with `OH = (H + 2 pad - dil (KH - 1) - 1) / stride + 1`.
    #[track_caller]
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: Conv2dOpts) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let op = "conv2d";
        let (x, squeeze) = batched(op, self, &loc)?;
        if weight.dim() != 4 {
            return Err(bad(
                op,
                &loc,
                format!("expected a 4-D weight [OC, C/groups, KH, KW], got {}", shape_text(weight)),
            ));
        }
        let dims = |t: &Tensor, d: i64| t.size(d).map(|s| s.as_const());
        let (oc, cg, kh, kw) = (dims(weight, 0)?, dims(weight, 1)?, dims(weight, 2)?, dims(weight, 3)?);
        let (Some(oc), Some(cg), Some(kh), Some(kw)) = (oc, cg, kh, kw) else {
            return Err(bad(op, &loc, format!("needs a weight of concrete size, got {}", shape_text(weight))));
        };
        let g = opts.groups as i64;
        let c = x.size(1)?;
        if g == 0 || oc % g != 0 || c.as_const().is_some_and(|c| c != cg * g) {
            return Err(bad(
                op,
                &loc,
                format!(
                    "input {} and weight {} with groups={}: expected {} input channels and output channels divisible by \
                     the groups",
                    shape_text(&x),
                    shape_text(weight),
                    opts.groups,
                    cg * g
                ),
            ));
        }
        if let Some(b) = bias {
            if b.dim() != 1 || b.size(0)?.as_const() != Some(oc) {
                return Err(bad(op, &loc, format!("expected a bias of shape [{oc}], got {}", shape_text(b))));
            }
        }
        // The geometry checks of `taps` (positive steps, a kernel that fits) come first.
        window_sizes(op, &x, [kh as usize, kw as usize], &opts, &loc)?;
        let y = dispatch(Op::Conv2d(conv_params(&opts)), &[&x, weight], &loc)?;
        let y = match bias {
            Some(b) => y.add(&b.view(&[1, oc, 1, 1])?)?,
            None => y,
        };
        unbatched(y, squeeze)
    }

    /// 2-D transposed convolution (PyTorch's `conv_transpose2d`, the gradient of
    /// `conv2d` with respect to its input): `self` `[N, C, H, W]` (or `[C, H, W]`),
    /// `weight` `[C, OC / groups, KH, KW]`, optional `bias` `[OC]`; the result is
    /// `[N, OC, OH, OW]` with `OH = (H - 1) stride - 2 pad + dil (KH - 1) +
    /// output_padding + 1`. One grouped matmul gives every tap's contribution
    /// `[N, OC, KH*KW, H, W]`; each tap is added into its strided window of the output
    /// (a slice scatter), and the padding is cropped.
    #[track_caller]
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv2dOpts,
        output_padding: [usize; 2],
    ) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let op = "conv_transpose2d";
        let (x, squeeze) = batched(op, self, &loc)?;
        if weight.dim() != 4 {
            return Err(bad(
                op,
                &loc,
                format!("expected a 4-D weight [C, OC/groups, KH, KW], got {}", shape_text(weight)),
            ));
        }
        let dims = |t: &Tensor, d: i64| t.size(d).map(|s| s.as_const());
        let (Some(cin), Some(ocg), Some(kh), Some(kw)) =
            (dims(weight, 0)?, dims(weight, 1)?, dims(weight, 2)?, dims(weight, 3)?)
        else {
            return Err(bad(op, &loc, format!("needs a weight of concrete size, got {}", shape_text(weight))));
        };
        let g = opts.groups as i64;
        if g == 0 || cin % g != 0 || x.size(1)?.as_const().is_some_and(|c| c != cin) {
            return Err(bad(
                op,
                &loc,
                format!(
                    "input {} and weight {} with groups={}: expected {cin} input channels, divisible by the groups",
                    shape_text(&x),
                    shape_text(weight),
                    opts.groups
                ),
            ));
        }
        if opts.stride.contains(&0) || opts.dilation.contains(&0) {
            return Err(bad(
                op,
                &loc,
                format!("stride {:?} and dilation {:?} must be positive", opts.stride, opts.dilation),
            ));
        }
        if output_padding.iter().zip(opts.stride.iter().zip(opts.dilation)).any(|(op, (s, d))| *op >= *s && *op >= d) {
            return Err(bad(
                op,
                &loc,
                format!("output padding {output_padding:?} must be smaller than either stride or dilation"),
            ));
        }
        let oc = ocg * g;
        if let Some(b) = bias {
            if b.dim() != 1 || b.size(0)?.as_const() != Some(oc) {
                return Err(bad(op, &loc, format!("expected a bias of shape [{oc}], got {}", shape_text(b))));
            }
        }
        let [h, w] = spatial(op, &x, &loc)?;
        if h == 0 || w == 0 || kh == 0 || kw == 0 {
            return Err(bad(
                op,
                &loc,
                format!(
                    "expected non-empty spatial sizes and kernel, got input {} and weight {}",
                    shape_text(&x),
                    shape_text(weight)
                ),
            ));
        }
        let k = [kh as usize, kw as usize];
        // Full (uncropped) output size per spatial dim.
        let full: Vec<usize> = (0..2)
            .map(|a| ([h, w][a] - 1) * opts.stride[a] + opts.dilation[a] * (k[a] - 1) + 1 + output_padding[a])
            .collect();
        if full.iter().zip(opts.padding).any(|(f, p)| *f <= 2 * p) {
            return Err(bad(
                op,
                &loc,
                format!("padding {:?} leaves an empty output for input {}", opts.padding, shape_text(&x)),
            ));
        }
        if output_padding.iter().zip(opts.stride).all(|(op, s)| *op < s) {
            // The gradient of the convolution from the output's size to this input's.
            let input = [full[0] - 2 * opts.padding[0], full[1] - 2 * opts.padding[1]];
            let y = dispatch(Op::Conv2dInputGrad { conv: conv_params(&opts), input }, &[&x, weight], &loc)?;
            let y = match bias {
                Some(b) => y.add(&b.view(&[1, oc, 1, 1])?)?,
                None => y,
            };
            return unbatched(y, squeeze);
        }
        // Taps: [1, g, OCg*KK, Cg] @ [N, g, Cg, H*W] -> [N, g, OCg, KK, H, W] -> [N, OC, KK, H, W].
        let n = x.size(0)?;
        let (cg, kk, hw) = (cin / g, kh * kw, (h * w) as i64);
        let wt = weight.reshape(&[g, cg, ocg * kk])?.transpose(1, 2)?.unsqueeze(0)?;
        let xs = x.reshape_dims(&[n.clone(), Dim::Const(g), Dim::Const(cg), Dim::Const(hw)])?;
        let taps = wt.matmul(&xs)?.reshape_dims(&[
            n.clone(),
            Dim::Const(oc),
            Dim::Const(kk),
            Dim::Const(h as i64),
            Dim::Const(w as i64),
        ])?;
        let mut y = Tensor::zeros_dims(
            &[n, Dim::Const(oc), Dim::Const(full[0] as i64), Dim::Const(full[1] as i64)],
            taps.dtype(),
        )?;
        for i in 0..k[0] {
            for j in 0..k[1] {
                let t = taps.select(2, (i * k[1] + j) as i64)?;
                let (r0, c0) = ((i * opts.dilation[0]) as i64, (j * opts.dilation[1]) as i64);
                let r1 = r0 + (opts.stride[0] * (h - 1) + 1) as i64;
                let c1 = c0 + (opts.stride[1] * (w - 1) + 1) as i64;
                let (sr, sc) = (opts.stride[0] as i64, opts.stride[1] as i64);
                let rows = y.slice(2, Some(r0), Some(r1), sr)?;
                let window = rows.slice(3, Some(c0), Some(c1), sc)?.add(&t)?;
                y = y.slice_scatter(
                    &rows.slice_scatter(&window, 3, Some(c0), Some(c1), sc)?,
                    2,
                    Some(r0),
                    Some(r1),
                    sr,
                )?;
            }
        }
        let [p0, p1] = [opts.padding[0] as i64, opts.padding[1] as i64];
        if p0 > 0 || p1 > 0 {
            y = y
                .slice(2, Some(p0), Some(full[0] as i64 - p0), 1)?
                .slice(3, Some(p1), Some(full[1] as i64 - p1), 1)?
                .contiguous()?;
        }
        let y = match bias {
            Some(b) => y.add(&b.view(&[1, oc, 1, 1])?)?,
            None => y,
        };
        unbatched(y, squeeze)
    }

    /// 2-D average pooling (PyTorch's `avg_pool2d` with `ceil_mode=False`,
    /// `count_include_pad=True`): the mean of each `kernel` window, zeros padded in.
    #[track_caller]
    pub fn avg_pool2d(&self, kernel: [usize; 2], stride: Option<[usize; 2]>, padding: [usize; 2]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let (x, squeeze) = batched("avg_pool2d", self, &loc)?;
        pool_pad_check("avg_pool2d", kernel, padding, &loc)?;
        let opts = Conv2dOpts { stride: stride.unwrap_or(kernel), padding, dilation: [1, 1], groups: 1 };
        let (parts, _) = taps("avg_pool2d", &x, kernel, &opts, 0.0, &loc)?;
        let mut sum = parts[0].clone();
        for t in &parts[1..] {
            sum = sum.add(t)?;
        }
        unbatched(sum.div((kernel[0] * kernel[1]) as f64)?, squeeze)
    }

    /// 2-D max pooling (PyTorch's `max_pool2d` with `ceil_mode=False`): the maximum of
    /// each `kernel` window (padding counts as -inf); the gradient goes to the first
    /// maximum of each window, as PyTorch's indices send it.
    #[track_caller]
    pub fn max_pool2d(
        &self,
        kernel: [usize; 2],
        stride: Option<[usize; 2]>,
        padding: [usize; 2],
        dilation: [usize; 2],
    ) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let (x, squeeze) = batched("max_pool2d", self, &loc)?;
        pool_pad_check("max_pool2d", kernel, padding, &loc)?;
        let opts = Conv2dOpts { stride: stride.unwrap_or(kernel), padding, dilation, groups: 1 };
        if x.dtype().is_float() {
            window_sizes("max_pool2d", &x, kernel, &opts, &loc)?;
            let p = Pool2dParams { kernel, stride: opts.stride, padding, dilation };
            return unbatched(dispatch(Op::MaxPool2d(p), &[&x], &loc)?, squeeze);
        }
        let pad = if x.dtype().is_float() { f64::NEG_INFINITY } else { i64::MIN as f64 };
        let (parts, _) = taps("max_pool2d", &x, kernel, &opts, pad, &loc)?;
        unbatched(first_max(&parts)?, squeeze)
    }

    /// Average pooling to an `out` size that divides the input's (PyTorch's
    /// `adaptive_avg_pool2d` in that case: windows of `H / OH` by `W / OW`).
    #[track_caller]
    pub fn adaptive_avg_pool2d(&self, out: [usize; 2]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let _site = super::user_site(&loc);
        let (x, _) = batched("adaptive_avg_pool2d", self, &loc)?;
        let [h, w] = spatial("adaptive_avg_pool2d", &x, &loc)?;
        if out.contains(&0) || h % out[0] != 0 || w % out[1] != 0 {
            return Err(bad(
                "adaptive_avg_pool2d",
                &loc,
                format!(
                    "output size {out:?} must divide the input size [{h}, {w}] (other sizes are not supported yet)"
                ),
            ));
        }
        let k = [h / out[0], w / out[1]];
        self.avg_pool2d(k, Some(k), [0, 0])
    }
}

/// PyTorch's rule: padding at most half the kernel.
fn pool_pad_check(op: &str, kernel: [usize; 2], padding: [usize; 2], loc: &SourceLoc) -> Result<()> {
    if padding.iter().zip(kernel).any(|(p, k)| 2 * p > k) {
        return Err(bad(
            op,
            loc,
            format!(
                "pad should be at most half of effective kernel size, got padding {padding:?} for kernel {kernel:?}"
            ),
        ));
    }
    Ok(())
}
