//! The bucket plan: which parameters' gradients travel together in one allreduce.
//!
//! Gradients are laid end to end in flat buffers of one dtype, in *reverse* parameter
//! order (a backward finishes the last layers' gradients first, so the first bucket
//! is the first one ready), a new bucket starting when the next gradient would take
//! the current one past its cap (a gradient larger than that travels alone) or has
//! another dtype. The first bucket's cap is smaller (`first_bytes`, as PyTorch's DDP
//! does with 1 MiB): the last layers' gradients go out while the backward has most
//! of its work ahead. Every rank builds the same plan from the same parameters.

use crate::error::{Error, Result};
use aotgrad_ir::DType;

/// One parameter's place in a bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The parameter's index in the module's parameter order.
    pub param: usize,
    /// First element in the bucket.
    pub offset: usize,
    /// Elements.
    pub len: usize,
}

/// One bucket: a flat buffer of `elems` elements of `dtype`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Every gradient in it has this dtype.
    pub dtype: DType,
    /// The parameters, in the order they are laid out.
    pub slots: Vec<Slot>,
    /// Elements in all.
    pub elems: usize,
}

/// The buckets of a module's gradients; see the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketPlan {
    /// In the order they are filled (reverse parameter order).
    pub buckets: Vec<Bucket>,
    /// `(bucket, slot)` of every parameter, by parameter index.
    pub place: Vec<(usize, usize)>,
}

impl BucketPlan {
    /// The plan for parameters `(name, dtype, elements)` in module order, the first
    /// bucket capped at `first_bytes`, the others at `bucket_bytes`. Only f32 and f64
    /// gradients can be averaged (an error naming the parameter otherwise).
    pub fn new(params: &[(String, DType, usize)], first_bytes: usize, bucket_bytes: usize) -> Result<BucketPlan> {
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut place = vec![(0, 0); params.len()];
        for (i, (name, dtype, len)) in params.iter().enumerate().rev() {
            if !matches!(dtype, DType::F32 | DType::F64) {
                return Err(Error::Invalid(format!(
                    "parameter {name}: gradients of {dtype:?} cannot be averaged across processes (f32 and f64 can)"
                )));
            }
            let bytes = len * dtype.size_bytes();
            let cap = if buckets.len() <= 1 { first_bytes } else { bucket_bytes };
            let fits = buckets
                .last()
                .is_some_and(|b| b.dtype == *dtype && (b.elems * dtype.size_bytes() + bytes <= cap || b.elems == 0));
            if !fits {
                buckets.push(Bucket { dtype: *dtype, slots: Vec::new(), elems: 0 });
            }
            let k = buckets.len() - 1;
            let b = &mut buckets[k];
            place[i] = (k, b.slots.len());
            b.slots.push(Slot { param: i, offset: b.elems, len: *len });
            b.elems += len;
        }
        Ok(BucketPlan { buckets, place })
    }

    /// Bytes of every bucket together.
    pub fn bytes(&self) -> usize {
        self.buckets.iter().map(|b| b.elems * b.dtype.size_bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, dtype: DType, len: usize) -> (String, DType, usize) {
        (name.to_string(), dtype, len)
    }

    #[test]
    fn buckets_fill_in_reverse_order_up_to_the_size() {
        // 400 bytes per bucket: w2 (100 f32) and b2 (20 f32) share one, w1 (80) and b1 (10) the next.
        let params =
            [p("w1", DType::F32, 80), p("b1", DType::F32, 10), p("w2", DType::F32, 100), p("b2", DType::F32, 20)];
        let plan = BucketPlan::new(&params, 480, 480).unwrap();
        let order: Vec<Vec<usize>> = plan.buckets.iter().map(|b| b.slots.iter().map(|s| s.param).collect()).collect();
        assert_eq!(order, vec![vec![3, 2], vec![1, 0]]);
        assert_eq!(plan.buckets[0].slots[1], Slot { param: 2, offset: 20, len: 100 });
        assert_eq!(plan.place[0], (1, 1));
        assert_eq!(plan.bytes(), 210 * 4);
    }

    #[test]
    fn a_large_gradient_travels_alone_and_dtypes_do_not_mix() {
        let params =
            [p("a", DType::F32, 10), p("big", DType::F32, 1000), p("c", DType::F64, 10), p("d", DType::F64, 5)];
        let plan = BucketPlan::new(&params, 128, 128).unwrap();
        let order: Vec<Vec<usize>> = plan.buckets.iter().map(|b| b.slots.iter().map(|s| s.param).collect()).collect();
        assert_eq!(order, vec![vec![3, 2], vec![1], vec![0]]);
        assert_eq!(plan.buckets[0].dtype, DType::F64);
    }

    #[test]
    fn the_first_bucket_is_smaller() {
        let params = [p("w1", DType::F32, 100), p("w2", DType::F32, 100), p("w3", DType::F32, 100)];
        let plan = BucketPlan::new(&params, 400, 800).unwrap();
        let order: Vec<Vec<usize>> = plan.buckets.iter().map(|b| b.slots.iter().map(|s| s.param).collect()).collect();
        assert_eq!(order, vec![vec![2], vec![1, 0]]);
    }

    #[test]
    fn integer_parameters_are_refused() {
        let e = BucketPlan::new(&[p("steps", DType::I64, 1)], 100, 100).unwrap_err().to_string();
        assert!(e.contains("steps"), "{e}");
    }
}
