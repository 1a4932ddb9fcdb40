//! probe
use aotgrad::prelude::*;
use aotgrad::{aot_function_args, Arg};
fn t(a: &Arg) -> aotgrad::trace::Result<Tensor> {
    match a {
        Arg::Tensor(t) => Ok(t.clone()),
        _ => panic!(),
    }
}
fn main() {
    let cfg = AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() };
    let c = aot_function_args(
        |a: &[Arg]| {
            let (x, y) = (t(&a[0])?, t(&a[1])?);
            x.slice(1, Some(0), None, 2)?.mul_(&y.slice(0, Some(1), Some(3), 1)?)?;
            x.slice(0, Some(1), None, 1)?.select(1, 3)?.fill_(-1)?;
            Ok(vec![x.sum(&[0], false)?, x.t()?])
        },
        cfg,
    )
    .unwrap();
    for b in [2usize, 3, 5] {
        let x = Tensor::randn(&[b, 4], DType::F32, 0).unwrap();
        let y = Tensor::randn(&[4], DType::F32, 1).unwrap();
        c.call_args(&[x.into(), y.into()]).unwrap();
    }
    for r in c.results() {
        println!("{}", r.meta.guard_expr());
    }
    for g in c.traced_graphs() {
        println!("{g}");
    }
}
