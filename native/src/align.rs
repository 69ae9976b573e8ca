//! Record batches aligned to one Arrow schema, as `align` in sluice's `formats/schemas.py` does: struct
//! fields by name (missing ones null, unknown ones dropped), lists and maps element-wise, other columns cast.

use std::sync::Arc;

use arrow_array::{new_null_array, Array, ArrayRef, ListArray, MapArray, RecordBatch, StructArray};
use arrow_schema::{ArrowError, DataType, FieldRef, Fields, SchemaRef};

/// Whether columns of `from` become `to` by [`conform`] without changing a value: the same type up to
/// field nullability, list and map field names, an enum's dictionary for its strings and a timestamp's
/// name of UTC; struct fields must match by name. (What arrow-avro makes of a schema against the types
/// sluice's Avro format gives it; anything else is decoded in Python.)
pub fn same_values(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    match (from, to) {
        _ if from == to => true,
        (Dictionary(_, v), Utf8) => **v == Utf8,
        (Timestamp(u1, t1), Timestamp(u2, t2)) => u1 == u2 && t1.is_some() == t2.is_some(),
        (Struct(a), Struct(b)) => same_fields(a, b),
        (List(a), List(b)) => same_values(a.data_type(), b.data_type()),
        (Map(a, _), Map(b, _)) => same_values(a.data_type(), b.data_type()),
        _ => false,
    }
}

/// Whether `from` has exactly the fields of `to` (by name, any order) with [`same_values`] types.
pub fn same_fields(from: &Fields, to: &Fields) -> bool {
    from.len() == to.len()
        && to.iter().all(|t| from.find(t.name()).is_some_and(|(_, f)| same_values(f.data_type(), t.data_type())))
}

fn child(fields: &Fields, children: &[ArrayRef], name: &str) -> Option<ArrayRef> {
    fields.find(name).map(|(i, _)| Arc::clone(&children[i]))
}

fn conform_fields(fields: &Fields, children: &[ArrayRef], to: &Fields, len: usize) -> Result<Vec<ArrayRef>, ArrowError> {
    to.iter()
        .map(|f: &FieldRef| match child(fields, children, f.name()) {
            Some(a) => conform(&a, f.data_type()),
            None => Ok(new_null_array(f.data_type(), len)),
        })
        .collect()
}

/// `a` as a column of type `to`.
pub fn conform(a: &ArrayRef, to: &DataType) -> Result<ArrayRef, ArrowError> {
    if a.data_type() == to {
        return Ok(Arc::clone(a));
    }
    match (a.data_type(), to) {
        (DataType::Struct(_), DataType::Struct(to_fields)) => {
            let s = a.as_any().downcast_ref::<StructArray>().expect("struct");
            let children = conform_fields(s.fields(), s.columns(), to_fields, s.len())?;
            Ok(Arc::new(StructArray::try_new(to_fields.clone(), children, s.nulls().cloned())?))
        }
        (DataType::List(_), DataType::List(to_field)) => {
            let l = a.as_any().downcast_ref::<ListArray>().expect("list");
            let values = conform(l.values(), to_field.data_type())?;
            Ok(Arc::new(ListArray::try_new(Arc::clone(to_field), l.offsets().clone(), values, l.nulls().cloned())?))
        }
        (DataType::Map(_, _), DataType::Map(to_entries, sorted)) => {
            let m = a.as_any().downcast_ref::<MapArray>().expect("map");
            let entries: ArrayRef = Arc::new(m.entries().clone());
            let entries = conform(&entries, to_entries.data_type())?;
            let entries = entries.as_any().downcast_ref::<StructArray>().expect("entries").clone();
            Ok(Arc::new(MapArray::try_new(Arc::clone(to_entries), m.offsets().clone(), entries, m.nulls().cloned(), *sorted)?))
        }
        _ => arrow_cast::cast(a, to),
    }
}

/// `batch` with exactly `schema`'s columns.
pub fn conform_batch(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    if batch.schema() == *schema {
        return Ok(batch.clone());
    }
    let columns = conform_fields(batch.schema().fields(), batch.columns(), schema.fields(), batch.num_rows())?;
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options)
}
