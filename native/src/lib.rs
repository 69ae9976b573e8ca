//! `sluice.connectors.kafka._native`: the Kafka source's read path without the GIL.
//!
//! [`consumer::Consumer`] fetches messages with librdkafka and turns each `consume` result into Arrow
//! columns (and, for JSON with a schema, the decoded record batch) while the GIL is released; Python
//! gets the batches through the Arrow C data interface. The reader logic (splits, positions,
//! checkpoints, watermarks, bad records) stays in Python: `native_reader.py`.

mod align;
mod avro;
mod avro_check;
mod client;
mod consumer;
mod fetch;
mod json;
mod py_wire;
mod wire;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<consumer::Consumer>()?;
    m.add_class::<py_wire::WireDecoder>()?;
    m.add("KafkaNativeError", m.py().get_type::<consumer::KafkaNativeError>())?;
    m.add("librdkafka_version", client::version())?;
    Ok(())
}
