//! A minimal pickle writer (protocol 2, which every Python 3 reads) for
//! the values PyTorch's memory snapshot holds: dicts with string keys,
//! lists, tuples, strings, integers and booleans. No memo: every
//! value is written where it stands, which `pickle.load` accepts.

pub enum Value {
    Bool(bool),
    Int(i128),
    Str(String),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    Dict(Vec<(String, Value)>),
}

impl Value {
    pub fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into())
    }

    pub fn int(v: impl Into<i128>) -> Value {
        Value::Int(v.into())
    }

    pub fn dict(items: Vec<(&str, Value)>) -> Value {
        Value::Dict(items.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }
}

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT1: u8 = b'K';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const EMPTY_DICT: u8 = b'}';
const EMPTY_TUPLE: u8 = b')';
const MARK: u8 = b'(';
const APPENDS: u8 = b'e';
const SETITEMS: u8 = b'u';
const TUPLE: u8 = b't';

/// Items per MARK ... APPENDS/SETITEMS batch, as CPython's pickler does.
const BATCH: usize = 1000;

pub fn dumps(v: &Value) -> Vec<u8> {
    let mut out = vec![PROTO, 2];
    write(v, &mut out);
    out.push(STOP);
    out
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    out.push(BINUNICODE);
    out.extend((s.len() as u32).to_le_bytes());
    out.extend(s.as_bytes());
}

fn write_int(v: i128, out: &mut Vec<u8>) {
    if (0..256).contains(&v) {
        out.extend([BININT1, v as u8]);
    } else if i32::try_from(v).is_ok() {
        out.push(BININT);
        out.extend((v as i32).to_le_bytes());
    } else {
        // LONG1: little-endian two's complement, as few bytes as hold
        // the value with its sign.
        let bytes = v.to_le_bytes();
        let mut n = bytes.len();
        while n > 1 {
            let (top, next) = (bytes[n - 1], bytes[n - 2]);
            if (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0) {
                n -= 1;
            } else {
                break;
            }
        }
        out.extend([LONG1, n as u8]);
        out.extend(&bytes[..n]);
    }
}

fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Bool(b) => out.push(if *b { NEWTRUE } else { NEWFALSE }),
        Value::Int(i) => write_int(*i, out),
        Value::Str(s) => write_str(s, out),
        Value::List(items) => {
            out.push(EMPTY_LIST);
            for chunk in items.chunks(BATCH) {
                out.push(MARK);
                for i in chunk {
                    write(i, out);
                }
                out.push(APPENDS);
            }
        }
        Value::Tuple(items) if items.is_empty() => out.push(EMPTY_TUPLE),
        Value::Tuple(items) => {
            out.push(MARK);
            for i in items {
                write(i, out);
            }
            out.push(TUPLE);
        }
        Value::Dict(items) => {
            out.push(EMPTY_DICT);
            for chunk in items.chunks(BATCH) {
                out.push(MARK);
                for (k, v) in chunk {
                    write_str(k, out);
                    write(v, out);
                }
                out.push(SETITEMS);
            }
        }
    }
}
