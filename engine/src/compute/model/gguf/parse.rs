//! The byte-level parser: a bounds-checked cursor and the header, metadata and tensor-info
//! records built on it.

use std::collections::HashMap;

use super::value::{MetaArray, MetaValue, ValueType};
use super::{
    DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, GgmlType, GgufError, GgufHeader, MAX_DIMS,
    Metadata, TensorInfo,
};

impl GgufHeader {
    /// Parses the header of a GGUF file whose whole contents are `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Self, GgufError> {
        parse_header(bytes)
    }
}

/// Deepest nesting of arrays accepted. Real files never nest; the limit keeps a hostile file
/// of nested array headers from recursing the parser off its stack.
pub(crate) const MAX_ARRAY_DEPTH: usize = 8;

/// Fewest bytes of one metadata pair: empty key (u64 length), type tag, one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes of one tensor info: empty name, one dimension, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// A read position in the file that refuses to read past the end.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: n,
                available: self.remaining(),
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count of items each at least `min_bytes` long, refused when the rest of the file
    /// could not hold them. Callers may then reserve `count` items safely.
    fn count(&mut self, what: &'static str, min_bytes: u64) -> Result<usize, GgufError> {
        let offset = self.pos as u64;
        let count = self.u64(what)?;
        let available = self.remaining();
        if count.saturating_mul(min_bytes) > available {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                offset,
                available,
            });
        }
        Ok(count as usize)
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { what, offset })
    }

    /// `count` fixed-size little-endian values, decoded by `decode`.
    fn fixed<const N: usize, T>(
        &mut self,
        count: usize,
        decode: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let bytes = self.take((count * N) as u64, "array elements")?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut b = [0u8; N];
                b.copy_from_slice(c);
                decode(b)
            })
            .collect())
    }

    fn bool(&mut self, key: &str) -> Result<bool, GgufError> {
        match self.array::<1>("bool value")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::InvalidBool {
                key: key.to_string(),
                byte,
            }),
        }
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let type_id = self.u32("value type")?;
        ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_string(),
            type_id,
        })
    }

    fn value(&mut self, key: &str, ty: ValueType) -> Result<MetaValue, GgufError> {
        Ok(match ty {
            ValueType::U8 => MetaValue::U8(self.array::<1>("value")?[0]),
            ValueType::I8 => MetaValue::I8(i8::from_le_bytes(self.array("value")?)),
            ValueType::U16 => MetaValue::U16(u16::from_le_bytes(self.array("value")?)),
            ValueType::I16 => MetaValue::I16(i16::from_le_bytes(self.array("value")?)),
            ValueType::U32 => MetaValue::U32(u32::from_le_bytes(self.array("value")?)),
            ValueType::I32 => MetaValue::I32(i32::from_le_bytes(self.array("value")?)),
            ValueType::F32 => MetaValue::F32(f32::from_le_bytes(self.array("value")?)),
            ValueType::U64 => MetaValue::U64(u64::from_le_bytes(self.array("value")?)),
            ValueType::I64 => MetaValue::I64(i64::from_le_bytes(self.array("value")?)),
            ValueType::F64 => MetaValue::F64(f64::from_le_bytes(self.array("value")?)),
            ValueType::Bool => MetaValue::Bool(self.bool(key)?),
            ValueType::String => MetaValue::String(self.string("string value")?),
            ValueType::Array => MetaValue::Array(self.meta_array(key, 1)?),
        })
    }

    /// An array's element type, length and elements; `depth` counts this array.
    fn meta_array(&mut self, key: &str, depth: usize) -> Result<MetaArray, GgufError> {
        let elem = self.value_type(key)?;
        let n = self.count("array element", elem.min_encoded_size())?;
        Ok(match elem {
            ValueType::U8 => MetaArray::U8(self.fixed(n, |[b]: [u8; 1]| b)?),
            ValueType::I8 => MetaArray::I8(self.fixed(n, i8::from_le_bytes)?),
            ValueType::U16 => MetaArray::U16(self.fixed(n, u16::from_le_bytes)?),
            ValueType::I16 => MetaArray::I16(self.fixed(n, i16::from_le_bytes)?),
            ValueType::U32 => MetaArray::U32(self.fixed(n, u32::from_le_bytes)?),
            ValueType::I32 => MetaArray::I32(self.fixed(n, i32::from_le_bytes)?),
            ValueType::F32 => MetaArray::F32(self.fixed(n, f32::from_le_bytes)?),
            ValueType::U64 => MetaArray::U64(self.fixed(n, u64::from_le_bytes)?),
            ValueType::I64 => MetaArray::I64(self.fixed(n, i64::from_le_bytes)?),
            ValueType::F64 => MetaArray::F64(self.fixed(n, f64::from_le_bytes)?),
            ValueType::Bool => {
                MetaArray::Bool((0..n).map(|_| self.bool(key)).collect::<Result<_, _>>()?)
            }
            ValueType::String => MetaArray::String(
                (0..n)
                    .map(|_| self.string("string array element"))
                    .collect::<Result<_, _>>()?,
            ),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::ArrayTooDeep {
                        key: key.to_string(),
                        max: MAX_ARRAY_DEPTH,
                    });
                }
                MetaArray::Array(
                    (0..n)
                        .map(|_| self.meta_array(key, depth + 1))
                        .collect::<Result<_, _>>()?,
                )
            }
        })
    }

    fn tensor_info(&mut self, alignment: u64) -> Result<TensorInfo, GgufError> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor dimension count")?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadDimCount {
                tensor: name,
                n_dims,
            });
        }
        let dims = (0..n_dims)
            .map(|_| self.u64("tensor dimension"))
            .collect::<Result<Vec<_>, _>>()?;
        let type_id = self.u32("tensor type")?;
        let dtype = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownGgmlType {
            tensor: name.clone(),
            type_id,
        })?;
        let offset = self.u64("tensor offset")?;
        let bad_shape = |reason| GgufError::BadShape {
            tensor: name.clone(),
            dims: dims.clone(),
            dtype,
            reason,
        };
        let n_elements = dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad_shape("element count overflows"))?;
        // Rows are checked on their own: a zero-length row makes the element count 0 whatever
        // the other dimensions multiply to.
        if dims[1..]
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .is_none()
        {
            return Err(bad_shape("row count overflows"));
        }
        if !dims[0].is_multiple_of(dtype.block_elems()) {
            return Err(bad_shape("rows are not a whole number of blocks"));
        }
        let n_bytes = dtype
            .bytes_for(n_elements)
            .ok_or_else(|| bad_shape("byte size overflows"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor {
                tensor: name,
                offset,
                alignment,
            });
        }
        Ok(TensorInfo {
            name,
            dims,
            dtype,
            offset,
            n_elements,
            n_bytes,
        })
    }
}

pub(crate) fn parse_header(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic = c.array::<4>("magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = c.u32("version")?;
    if version != GGUF_VERSION {
        return Err(if version == GGUF_VERSION.swap_bytes() {
            GgufError::BigEndian
        } else {
            GgufError::UnsupportedVersion(version)
        });
    }
    // The tensor count precedes the metadata; it is bounded once the metadata has been read.
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.count("metadata pair", MIN_KV_BYTES)?;

    let mut metadata = Metadata::default();
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        let ty = c.value_type(&key)?;
        let value = c.value(&key, ty)?;
        metadata.insert(key, value)?;
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() => a,
            _ => return Err(GgufError::BadAlignment(v.to_string())),
        },
    };

    if n_tensors.saturating_mul(MIN_TENSOR_INFO_BYTES) > c.remaining() {
        return Err(GgufError::CountTooLarge {
            what: "tensor",
            count: n_tensors,
            offset: 8,
            available: c.remaining(),
        });
    }
    let n_tensors = n_tensors as usize;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let info = c.tensor_info(alignment)?;
        if tensor_index.insert(info.name.clone(), i).is_some() {
            return Err(GgufError::DuplicateTensor(info.name));
        }
        tensors.push(info);
    }

    // The data section starts at the next multiple of the alignment; the padding itself may be
    // missing when there are no tensors, so only tensor ranges are checked against the length.
    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    let file_len = bytes.len() as u64;
    for t in &tensors {
        let start = u128::from(data_offset) + u128::from(t.offset);
        let end = start + u128::from(t.n_bytes);
        if end > u128::from(file_len) {
            return Err(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                start,
                end,
                file_len,
            });
        }
    }
    Ok(GgufHeader {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
        tensor_index,
    })
}
