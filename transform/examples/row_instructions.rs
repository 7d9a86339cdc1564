//! The row evaluator on the on-demand benchmark's five expressions (bench/on_demand_serve_bench.py),
//! for counting its instructions per expression per row under cachegrind:
//!
//!     valgrind --tool=cachegrind --cache-sim=no target/release/examples/row_instructions ROWS [row|vectorized|harness]
//!
//! run twice with two row counts; the difference of the totals over the difference of
//! the rows, over five, is the cost of one expression for one row (start-up and compiling
//! cancel out). With `vectorized`, each row is computed by DataFusion over a one-row batch
//! instead (what a lookup of one entity paid before the row evaluator); with `harness`,
//! nothing is computed: the loop's own cost, subtracted from both. `./run
//! bench-on-demand` does this.
//!
//! It allocates with mimalloc, the allocator the `quiver` binary serves with: the two
//! strings each row returns are the evaluator's only allocations, and what they cost is
//! the allocator's (bench/RESULTS.md gives the figure under glibc's malloc too).

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, TimeUnit};
use quiver_transform::{Column, Output, Program, ScalarValue};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let rows: usize = args.next().and_then(|a| a.parse().ok()).expect("usage: row_instructions ROWS [row|vectorized|harness]");
    let mode = args.next().unwrap_or_default();
    let (vectorized, harness) = (mode == "vectorized", mode == "harness");
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let mut columns: Vec<Column> = (0..5).map(|i| Column::qualified("driver_a", format!("a{i}"), DataType::Float64)).collect();
    columns.push(Column::qualified("driver_a", "event_timestamp", ts.clone()));
    columns.push(Column::bare("amount", DataType::Float64));
    columns.push(Column::bare("pickup_city", DataType::Utf8));
    columns.push(Column::bare("request_time", ts));
    let outputs = [
        ("ratio", DataType::Float64, "driver_a.a0 * driver_a.a1 + driver_a.a2"),
        ("band", DataType::Utf8, "CASE WHEN driver_a.a3 > 50 THEN 'high' ELSE 'low' END"),
        ("city_up", DataType::Utf8, "upper(pickup_city)"),
        ("per_amount", DataType::Float64, "amount / NULLIF(driver_a.a4, 0)"),
        ("age_s", DataType::Float64, "date_part('epoch', request_time - driver_a.event_timestamp)"),
    ]
    .map(|(name, dtype, expr)| Output { name: name.into(), dtype, expr: expr.into() });
    let program = Program::compile(&columns, &outputs).expect("the benchmark's expressions compile");
    let utc = Some(Arc::<str>::from("UTC"));
    // The rows are built before counting starts (the same 64 for any ROWS), so what is
    // counted per row is the evaluator's work and dropping what it returns, not making
    // its input.
    let pool: Vec<Vec<ScalarValue>> = (0..64)
        .map(|r: usize| {
            let x = r as f64;
            vec![
                ScalarValue::Float64(Some(x * 0.5)),
                ScalarValue::Float64(Some(1.25)),
                ScalarValue::Float64(Some(3.0)),
                ScalarValue::Float64(Some(x * 1.7)),
                ScalarValue::Float64(Some(if r.is_multiple_of(7) { 0.0 } else { x })),
                ScalarValue::TimestampMicrosecond(Some(1_700_000_000_000_000 + r as i64), utc.clone()),
                ScalarValue::Float64(Some(12.5)),
                ScalarValue::Utf8(Some(["paris", "Berlin", "tokyo"][r % 3].to_string())),
                ScalarValue::TimestampMicrosecond(Some(1_700_000_360_000_000), utc.clone()),
            ]
        })
        .collect();
    let mut out = Vec::with_capacity(5);
    let mut checksum = 0usize;
    for r in 0..rows {
        let row = &pool[r % pool.len()];
        out.clear();
        if harness {
            // The loop alone: what the other modes count beside the evaluator's work.
            checksum += std::hint::black_box(row).len();
        } else if vectorized {
            let arrays: Vec<ArrayRef> = row.iter().map(|v| v.to_array().expect("an array of one")).collect();
            let batch = RecordBatch::try_new(Arc::clone(program.input_schema()), arrays).expect("the program's columns");
            let done = program.evaluate(&batch).expect("the program's columns");
            checksum += done.columns.iter().map(|c| c.len()).sum::<usize>();
        } else {
            program.evaluate_row(row, &mut out).expect("one value per column");
            checksum += out.len();
        }
    }
    println!("{rows} rows, {checksum}");
}
