//! Element types, scalars and PyTorch's type-promotion rules.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// Boolean.
    Bool,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// IEEE half precision (stored as such, computed in f32).
    F16,
    /// bfloat16 (stored as such, computed in f32).
    BF16,
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
}

/// The three promotion categories, ordered: bool < integral < floating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    /// `bool`.
    Bool,
    /// Signed integers.
    Integral,
    /// Floating point.
    Floating,
}

impl DType {
    /// Every dtype, in a fixed order (useful for property tests).
    pub const ALL: [DType; 7] = [DType::Bool, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];
    /// The float type used when an integral value must become floating.
    pub const DEFAULT_FLOAT: DType = DType::F32;

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bool => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
    /// Promotion category.
    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::I32 | DType::I64 => Category::Integral,
            _ => Category::Floating,
        }
    }
    /// True for floating-point dtypes.
    pub fn is_float(self) -> bool {
        self.category() == Category::Floating
    }
    /// True for integral dtypes (not bool).
    pub fn is_int(self) -> bool {
        self.category() == Category::Integral
    }
    /// Short name used by the text format (`f32`, `i64`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }
    /// Inverse of [`DType::name`].
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }
    /// `torch.promote_types`: the smallest dtype both values fit in.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a.category(), b.category()) {
            (Category::Bool, _) => b,
            (_, Category::Bool) => a,
            (Category::Integral, Category::Integral) => I64,
            (Category::Integral, Category::Floating) => b,
            (Category::Floating, Category::Integral) => a,
            (Category::Floating, Category::Floating) => match (a, b) {
                (F64, _) | (_, F64) => F64,
                _ => F32, // f16+bf16, f16+f32, bf16+f32
            },
        }
    }
    /// Whether a value of type `from` may be written into a tensor of type `self`
    /// by an in-place op (PyTorch's `can_cast`): never to a lower category.
    pub fn can_hold(self, from: DType) -> bool {
        self.category() >= from.category()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A scalar operand or constant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Scalar {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float (always carried as f64).
    Float(f64),
}

impl Scalar {
    /// Promotion category of the scalar.
    pub fn category(self) -> Category {
        match self {
            Scalar::Bool(_) => Category::Bool,
            Scalar::Int(_) => Category::Integral,
            Scalar::Float(_) => Category::Floating,
        }
    }
    /// The value as f64.
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(x) => x,
        }
    }
    /// The value as i64 (floats truncate toward zero).
    pub fn to_i64(self) -> i64 {
        match self {
            Scalar::Bool(b) => b as i64,
            Scalar::Int(i) => i,
            Scalar::Float(x) => x as i64,
        }
    }
    /// The value as bool (non-zero is true).
    pub fn to_bool(self) -> bool {
        match self {
            Scalar::Bool(b) => b,
            Scalar::Int(i) => i != 0,
            Scalar::Float(x) => x != 0.0,
        }
    }
    /// The dtype a scalar has on its own (bool, i64, or the default float).
    pub fn default_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::DEFAULT_FLOAT,
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            // `{:?}` prints the shortest text that parses back to the same f64,
            // and always with a `.` or exponent, so ints and floats stay apart.
            Scalar::Float(x) => write!(f, "{x:?}"),
        }
    }
}

impl From<f64> for Scalar {
    fn from(x: f64) -> Self {
        Scalar::Float(x)
    }
}
impl From<f32> for Scalar {
    fn from(x: f32) -> Self {
        Scalar::Float(x as f64)
    }
}
impl From<i64> for Scalar {
    fn from(x: i64) -> Self {
        Scalar::Int(x)
    }
}
impl From<i32> for Scalar {
    fn from(x: i32) -> Self {
        Scalar::Int(x as i64)
    }
}
impl From<bool> for Scalar {
    fn from(x: bool) -> Self {
        Scalar::Bool(x)
    }
}

/// One participant in a type-promotion decision.
#[derive(Clone, Copy, Debug)]
pub enum Operand {
    /// A tensor with at least one dimension.
    Tensor(DType),
    /// A zero-dimensional tensor (weaker than dimensioned tensors).
    ZeroDim(DType),
    /// A wrapped number (weakest: only its category counts).
    Scalar(Scalar),
}

impl Operand {
    /// The participant a tensor argument is: zero-dim tensors are weaker than
    /// dimensioned ones.
    pub fn of(meta: &crate::meta::TensorMeta) -> Operand {
        if meta.rank() == 0 {
            Operand::ZeroDim(meta.dtype)
        } else {
            Operand::Tensor(meta.dtype)
        }
    }
}

/// PyTorch's `result_type`: dimensioned tensors win over zero-dim tensors, which win
/// over scalars, unless a weaker participant is of a higher category, in which case
/// the result is the default type of that category at the weaker level.
pub fn result_type(ops: &[Operand]) -> DType {
    let mut dim: Option<DType> = None;
    let mut zero: Option<DType> = None;
    let mut scal: Option<DType> = None;
    let fold = |acc: &mut Option<DType>, d: DType| {
        *acc = Some(match *acc {
            None => d,
            Some(a) => DType::promote(a, d),
        })
    };
    for op in ops {
        match *op {
            Operand::Tensor(d) => fold(&mut dim, d),
            Operand::ZeroDim(d) => fold(&mut zero, d),
            Operand::Scalar(s) => fold(&mut scal, s.default_dtype()),
        }
    }
    let combine = |high: Option<DType>, low: Option<DType>| -> Option<DType> {
        match (high, low) {
            (None, l) => l,
            (h, None) => h,
            (Some(h), Some(l)) => {
                if l.category() > h.category() {
                    // A weaker participant of a higher category: its own type.
                    Some(l)
                } else {
                    Some(h)
                }
            }
        }
    };
    // Scalars of a higher category yield the *default* type of that category.
    let zs = combine(zero, scal.map(|s| if s.is_float() { DType::DEFAULT_FLOAT } else { s }));
    combine(dim, zs).unwrap_or(DType::DEFAULT_FLOAT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_pytorch() {
        use DType::*;
        assert_eq!(DType::promote(I32, F16), F16);
        assert_eq!(DType::promote(F16, BF16), F32);
        assert_eq!(DType::promote(Bool, I32), I32);
        assert_eq!(DType::promote(I32, I64), I64);
        assert_eq!(result_type(&[Operand::Tensor(I32), Operand::Scalar(Scalar::Float(2.5))]), F32);
        assert_eq!(result_type(&[Operand::Tensor(F16), Operand::Scalar(Scalar::Float(2.5))]), F16);
        assert_eq!(result_type(&[Operand::Tensor(I32), Operand::Scalar(Scalar::Int(2))]), I32);
        assert_eq!(result_type(&[Operand::Tensor(F16), Operand::ZeroDim(F64)]), F16);
        assert_eq!(result_type(&[Operand::Tensor(I32), Operand::ZeroDim(F64)]), F64);
        assert_eq!(result_type(&[Operand::Tensor(Bool), Operand::Scalar(Scalar::Int(1))]), I64);
        assert_eq!(result_type(&[Operand::ZeroDim(I32), Operand::ZeroDim(F16)]), F16);
    }
}
