//! The loss and accuracy curves of a run, as an SVG (plotters).

use crate::train::TrainReport;
use plotters::prelude::*;
use std::path::Path;

/// Draw the training loss (per step, smoothed, and per epoch), the test loss and the
/// test accuracy per epoch into `path`.
pub fn curves(path: &Path, report: &TrainReport) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(520);
    let steps = report.step_losses.len().max(1);
    let per_epoch = steps as f64 / report.epochs.len().max(1) as f64;
    // A moving mean over ~1/10 of an epoch.
    let window = ((per_epoch / 10.0) as usize).max(1);
    let smoothed: Vec<(f64, f64)> = report
        .step_losses
        .chunks(window)
        .enumerate()
        .map(|(i, c)| (((i * window + c.len() / 2) as f64) / per_epoch, c.iter().sum::<f64>() / c.len() as f64))
        .collect();
    let epochs = report.epochs.len().max(1) as f64;
    let max_loss = smoothed.iter().map(|p| p.1).chain(report.epochs.iter().map(|e| e.test_loss)).fold(0.1, f64::max);
    let mut chart = ChartBuilder::on(&left)
        .caption("loss", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(44)
        .build_cartesian_2d(0.0..epochs, 0.0..max_loss * 1.05)
        .map_err(|e| err(&e))?;
    chart.configure_mesh().x_desc("epoch").draw().map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(smoothed, BLUE.mix(0.5)))
        .map_err(|e| err(&e))?
        .label("train (steps)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE.mix(0.5)));
    chart
        .draw_series(LineSeries::new(
            report.epochs.iter().map(|e| (e.epoch as f64 - 0.5, e.train_loss)),
            BLUE.stroke_width(2),
        ))
        .map_err(|e| err(&e))?
        .label("train (epoch mean)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(report.epochs.iter().map(|e| (e.epoch as f64, e.test_loss)), RED.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label("test")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RED.stroke_width(2)));
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw().map_err(|e| err(&e))?;

    let accs: Vec<(f64, f64)> = report.epochs.iter().map(|e| (e.epoch as f64, 100.0 * e.test_accuracy)).collect();
    let lo = accs.iter().map(|p| p.1).fold(100.0, f64::min);
    let hi = accs.iter().map(|p| p.1).fold(0.0, f64::max);
    let lo = (lo - 2.0).clamp(0.0, 99.0).floor();
    let hi = (hi + 1.5).clamp(lo + 1.0, 100.0).ceil();
    let mut chart = ChartBuilder::on(&right)
        .caption("test accuracy (%)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(44)
        .build_cartesian_2d(0.0..epochs + 0.5, lo..hi)
        .map_err(|e| err(&e))?;
    chart.configure_mesh().x_desc("epoch").draw().map_err(|e| err(&e))?;
    chart.draw_series(LineSeries::new(accs.clone(), RGBColor(0, 130, 60).stroke_width(2))).map_err(|e| err(&e))?;
    chart.draw_series(accs.iter().map(|&p| Circle::new(p, 3, RGBColor(0, 130, 60).filled()))).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}
