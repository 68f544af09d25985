//! Postgres values from the binary wire format into JSON, for every type a query may return.
//!
//! Invariants: decoding never fails a query: a short or unknown value becomes a string that says
//! its type and size and how to see it (`::text`); numerics, dates, times, intervals and network
//! addresses read as Postgres prints them.

use std::error::Error as StdError;

use serde_json::{json, Value};
use tokio_postgres::types::{FromSql, Kind, Type};

/// Any Postgres value, decoded from the binary wire format into JSON.
pub(super) struct PgCell(pub(super) Value);

impl<'a> FromSql<'a> for PgCell {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn StdError + Sync + Send>> {
        Ok(PgCell(
            decode(ty, raw).unwrap_or_else(|| undecodable(ty, raw)),
        ))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

fn undecodable(ty: &Type, raw: &[u8]) -> Value {
    Value::String(format!(
        "<{} value, {} bytes: cast it to text (::text) to see it>",
        ty.name(),
        raw.len()
    ))
}

/// Reads big-endian numbers off a byte slice, failing softly on short input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn i16(&mut self) -> Option<i16> {
        self.take(2).map(|b| i16::from_be_bytes([b[0], b[1]]))
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self) -> Option<i64> {
        self.take(8)
            .map(|b| i64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
}

fn utf8(raw: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(raw).into_owned())
}

fn float(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or_else(|| Value::String(f.to_string()), Value::Number)
}

fn decode(ty: &Type, raw: &[u8]) -> Option<Value> {
    match ty.kind() {
        Kind::Enum(_) => return Some(utf8(raw)),
        Kind::Domain(inner) => return decode(inner, raw),
        Kind::Array(member) => return decode_array(member, raw),
        _ => {}
    }
    let mut r = Reader(raw);
    let value = match *ty {
        Type::BOOL => Value::Bool(*raw.first()? != 0),
        Type::INT2 => json!(r.i16()?),
        Type::INT4 => json!(r.i32()?),
        Type::INT8 => json!(r.i64()?),
        Type::OID | Type::XID | Type::CID | Type::REGCLASS | Type::REGPROC | Type::REGTYPE => {
            json!(u32::try_from(r.i32()?).ok().unwrap_or_default())
        }
        Type::FLOAT4 => float(f64::from(f32::from_bits(u32::from_be_bytes(
            r.take(4)?.try_into().ok()?,
        )))),
        Type::FLOAT8 => float(f64::from_bits(u64::from_be_bytes(
            r.take(8)?.try_into().ok()?,
        ))),
        Type::NUMERIC => Value::String(decode_numeric(&mut r)?),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN | Type::XML => {
            utf8(raw)
        }
        Type::CHAR => Value::String((*raw.first()? as char).to_string()),
        Type::JSON => serde_json::from_slice(raw).unwrap_or_else(|_| utf8(raw)),
        Type::JSONB => {
            let body = raw.get(1..)?;
            serde_json::from_slice(body).unwrap_or_else(|_| utf8(body))
        }
        Type::UUID => {
            let h = hex::encode(r.take(16)?);
            Value::String(format!(
                "{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            ))
        }
        Type::BYTEA => Value::String(format!("\\x{}", hex::encode(raw))),
        Type::DATE => Value::String(decode_date(r.i32()?)?),
        Type::TIMESTAMP => Value::String(decode_timestamp(r.i64()?)?),
        Type::TIMESTAMPTZ => Value::String(decode_timestamp(r.i64()?)? + "+00"),
        Type::TIME => Value::String(decode_time(r.i64()?)),
        Type::TIMETZ => {
            let time = decode_time(r.i64()?);
            let west = r.i32()?;
            let east = -west;
            let sign = if east < 0 { '-' } else { '+' };
            let (h, m) = (east.abs() / 3600, (east.abs() % 3600) / 60);
            Value::String(if m == 0 {
                format!("{time}{sign}{h:02}")
            } else {
                format!("{time}{sign}{h:02}:{m:02}")
            })
        }
        Type::INTERVAL => {
            let micros = r.i64()?;
            let days = r.i32()?;
            let months = r.i32()?;
            Value::String(decode_interval(micros, days, months))
        }
        Type::MONEY => {
            let cents = r.i64()?;
            let sign = if cents < 0 { "-" } else { "" };
            Value::String(format!(
                "{sign}{}.{:02}",
                (cents / 100).abs(),
                (cents % 100).abs()
            ))
        }
        Type::INET | Type::CIDR => Value::String(decode_inet(&mut r)?),
        _ if ty.name() == "citext" || ty.name() == "ltree" => utf8(raw),
        _ => return None,
    };
    Some(value)
}

fn decode_array(member: &Type, raw: &[u8]) -> Option<Value> {
    let mut r = Reader(raw);
    let ndim = usize::try_from(r.i32()?).ok()?;
    let _flags = r.i32()?;
    let _oid = r.i32()?;
    let mut dims = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        dims.push(usize::try_from(r.i32()?).ok()?);
        let _lower_bound = r.i32()?;
    }
    let count: usize = if ndim == 0 { 0 } else { dims.iter().product() };
    let mut values = Vec::with_capacity(count.min(10_000));
    for _ in 0..count {
        let len = r.i32()?;
        if len < 0 {
            values.push(Value::Null);
        } else {
            let bytes = r.take(usize::try_from(len).ok()?)?;
            values.push(decode(member, bytes).unwrap_or_else(|| undecodable(member, bytes)));
        }
    }
    // Nest from the innermost dimension outwards.
    for &dim in dims.iter().skip(1).rev() {
        if dim == 0 {
            break;
        }
        values = values
            .chunks(dim)
            .map(|c| Value::Array(c.to_vec()))
            .collect();
    }
    Some(Value::Array(values))
}

fn decode_numeric(r: &mut Reader<'_>) -> Option<String> {
    let ndigits = usize::try_from(r.i16()?).ok()?;
    let weight = r.i16()?;
    let sign = r.u16()?;
    let dscale = usize::from(r.u16()?);
    match sign {
        0xC000 => return Some("NaN".into()),
        0xD000 => return Some("Infinity".into()),
        0xF000 => return Some("-Infinity".into()),
        _ => {}
    }
    let mut digits = Vec::with_capacity(ndigits);
    for _ in 0..ndigits {
        digits.push(r.i16()?);
    }
    let digit = |i: i32| -> i16 {
        usize::try_from(i)
            .ok()
            .and_then(|i| digits.get(i).copied())
            .unwrap_or(0)
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for d in 0..=i32::from(weight) {
            if d == 0 {
                out.push_str(&digit(d).to_string());
            } else {
                out.push_str(&format!("{:04}", digit(d)));
            }
        }
    }
    if dscale > 0 {
        let mut frac = String::new();
        let mut d = i32::from(weight) + 1;
        while frac.len() < dscale {
            frac.push_str(&format!("{:04}", digit(d)));
            d += 1;
        }
        frac.truncate(dscale);
        out.push('.');
        out.push_str(&frac);
    }
    Some(out)
}

fn epoch() -> Option<chrono::NaiveDateTime> {
    chrono::NaiveDate::from_ymd_opt(2000, 1, 1)?.and_hms_opt(0, 0, 0)
}

fn decode_date(days: i32) -> Option<String> {
    match days {
        i32::MAX => Some("infinity".into()),
        i32::MIN => Some("-infinity".into()),
        _ => Some((epoch()?.date() + chrono::Duration::days(i64::from(days))).to_string()),
    }
}

fn decode_timestamp(micros: i64) -> Option<String> {
    match micros {
        i64::MAX => Some("infinity".into()),
        i64::MIN => Some("-infinity".into()),
        _ => {
            let at = epoch()?.checked_add_signed(chrono::Duration::microseconds(micros))?;
            Some(at.format("%Y-%m-%d %H:%M:%S%.f").to_string())
        }
    }
}

fn decode_time(micros: i64) -> String {
    let secs = micros / 1_000_000;
    let frac = micros % 1_000_000;
    let base = format!(
        "{:02}:{:02}:{:02}",
        secs / 3600,
        (secs % 3600) / 60,
        secs % 60
    );
    if frac == 0 {
        base
    } else {
        format!("{base}.{}", format!("{frac:06}").trim_end_matches('0'))
    }
}

fn decode_interval(micros: i64, days: i32, months: i32) -> String {
    let mut parts = Vec::new();
    let (years, months) = (months / 12, months % 12);
    if years != 0 {
        parts.push(format!(
            "{years} year{}",
            if years.abs() == 1 { "" } else { "s" }
        ));
    }
    if months != 0 {
        parts.push(format!(
            "{months} mon{}",
            if months.abs() == 1 { "" } else { "s" }
        ));
    }
    if days != 0 {
        parts.push(format!(
            "{days} day{}",
            if days.abs() == 1 { "" } else { "s" }
        ));
    }
    if micros != 0 || parts.is_empty() {
        let sign = if micros < 0 { "-" } else { "" };
        parts.push(format!("{sign}{}", decode_time(micros.abs())));
    }
    parts.join(" ")
}

fn decode_inet(r: &mut Reader<'_>) -> Option<String> {
    let family = r.take(1)?[0];
    let bits = r.take(1)?[0];
    let _is_cidr = r.take(1)?[0];
    let len = usize::from(r.take(1)?[0]);
    let addr = r.take(len)?;
    let (text, full) = match family {
        2 if len == 4 => (
            std::net::Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]).to_string(),
            32,
        ),
        3 if len == 16 => {
            let octets: [u8; 16] = addr.try_into().ok()?;
            (std::net::Ipv6Addr::from(octets).to_string(), 128)
        }
        _ => return None,
    };
    Some(if bits == full {
        text
    } else {
        format!("{text}/{bits}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn numeric(ndigits: i16, weight: i16, sign: u16, dscale: u16, digits: &[i16]) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&ndigits.to_be_bytes());
        raw.extend_from_slice(&weight.to_be_bytes());
        raw.extend_from_slice(&sign.to_be_bytes());
        raw.extend_from_slice(&dscale.to_be_bytes());
        for d in digits {
            raw.extend_from_slice(&d.to_be_bytes());
        }
        raw
    }

    #[test]
    fn numerics_decode_to_their_text() {
        let check = |raw: Vec<u8>, expected: &str| {
            assert_eq!(decode_numeric(&mut Reader(&raw)).as_deref(), Some(expected));
        };
        check(numeric(1, 0, 0, 0, &[42]), "42");
        check(numeric(2, 0, 0, 2, &[12, 5000]), "12.50");
        check(numeric(2, 1, 0x4000, 0, &[1, 2345]), "-12345");
        check(numeric(1, -1, 0, 4, &[5]), "0.0005");
        check(numeric(1, -2, 0, 8, &[7]), "0.00000007");
        check(numeric(0, 0, 0, 2, &[]), "0.00");
        check(numeric(0, 0, 0xC000, 0, &[]), "NaN");
    }

    #[test]
    fn times_decode_to_their_text() {
        assert_eq!(decode_date(0).as_deref(), Some("2000-01-01"));
        assert_eq!(decode_date(-1).as_deref(), Some("1999-12-31"));
        assert_eq!(
            decode_timestamp(1_500_000).as_deref(),
            Some("2000-01-01 00:00:01.500")
        );
        assert_eq!(decode_time(3_723_000_001), "01:02:03.000001");
        assert_eq!(
            decode_interval(3_600_000_000, 3, 14),
            "1 year 2 mons 3 days 01:00:00"
        );
        assert_eq!(decode_interval(0, 0, 0), "00:00:00");
    }
}
