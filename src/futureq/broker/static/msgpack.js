// A small MessagePack codec for the FutureQ dashboard (https://msgpack.org spec).
// Enough of the format for the wire protocol (docs/protocol.md, "Encoding rules"):
// nil, booleans, integers up to 64 bits, floats, str (UTF-8), bin, arrays and maps
// with string keys. Extension types are refused, as the protocol never uses them.
// Integers beyond 2**53 decode as BigInt so that no value changes silently.
"use strict";

const msgpack = (() => {
  const utf8Encoder = new TextEncoder();
  const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

  class Writer {
    constructor() {
      this.bytes = new Uint8Array(256);
      this.view = new DataView(this.bytes.buffer);
      this.length = 0;
    }
    reserve(n) {
      if (this.length + n <= this.bytes.length) return;
      let size = this.bytes.length * 2;
      while (size < this.length + n) size *= 2;
      const grown = new Uint8Array(size);
      grown.set(this.bytes.subarray(0, this.length));
      this.bytes = grown;
      this.view = new DataView(grown.buffer);
    }
    u8(v) { this.reserve(1); this.view.setUint8(this.length, v); this.length += 1; }
    u16(v) { this.reserve(2); this.view.setUint16(this.length, v); this.length += 2; }
    u32(v) { this.reserve(4); this.view.setUint32(this.length, v); this.length += 4; }
    u64(v) { this.reserve(8); this.view.setBigUint64(this.length, BigInt(v)); this.length += 8; }
    i64(v) { this.reserve(8); this.view.setBigInt64(this.length, BigInt(v)); this.length += 8; }
    f64(v) { this.reserve(8); this.view.setFloat64(this.length, v); this.length += 8; }
    raw(b) { this.reserve(b.length); this.bytes.set(b, this.length); this.length += b.length; }
  }

  function encodeInto(w, value) {
    if (value === null || value === undefined) { w.u8(0xc0); return; }
    if (value === false) { w.u8(0xc2); return; }
    if (value === true) { w.u8(0xc3); return; }
    if (typeof value === "bigint") {
      if (value >= 0n) { w.u8(0xcf); w.u64(value); } else { w.u8(0xd3); w.i64(value); }
      return;
    }
    if (typeof value === "number") {
      if (Number.isInteger(value) && Number.isSafeInteger(value)) {
        if (value >= 0) {
          if (value < 0x80) w.u8(value);
          else if (value < 0x100) { w.u8(0xcc); w.u8(value); }
          else if (value < 0x10000) { w.u8(0xcd); w.u16(value); }
          else if (value < 0x100000000) { w.u8(0xce); w.u32(value); }
          else { w.u8(0xcf); w.u64(value); }
        } else if (value >= -32) {
          w.u8(value & 0xff);
        } else {
          w.u8(0xd3); w.i64(value);
        }
      } else {
        w.u8(0xcb); w.f64(value);
      }
      return;
    }
    if (typeof value === "string") {
      const b = utf8Encoder.encode(value);
      if (b.length < 32) w.u8(0xa0 | b.length);
      else if (b.length < 0x100) { w.u8(0xd9); w.u8(b.length); }
      else if (b.length < 0x10000) { w.u8(0xda); w.u16(b.length); }
      else { w.u8(0xdb); w.u32(b.length); }
      w.raw(b);
      return;
    }
    if (value instanceof Uint8Array) {
      if (value.length < 0x100) { w.u8(0xc4); w.u8(value.length); }
      else if (value.length < 0x10000) { w.u8(0xc5); w.u16(value.length); }
      else { w.u8(0xc6); w.u32(value.length); }
      w.raw(value);
      return;
    }
    if (Array.isArray(value)) {
      if (value.length < 16) w.u8(0x90 | value.length);
      else if (value.length < 0x10000) { w.u8(0xdc); w.u16(value.length); }
      else { w.u8(0xdd); w.u32(value.length); }
      for (const item of value) encodeInto(w, item);
      return;
    }
    if (typeof value === "object") {
      const keys = Object.keys(value);
      if (keys.length < 16) w.u8(0x80 | keys.length);
      else if (keys.length < 0x10000) { w.u8(0xde); w.u16(keys.length); }
      else { w.u8(0xdf); w.u32(keys.length); }
      for (const key of keys) { encodeInto(w, key); encodeInto(w, value[key]); }
      return;
    }
    throw new TypeError(`msgpack: cannot encode a ${typeof value}`);
  }

  function encode(value) {
    const w = new Writer();
    encodeInto(w, value);
    return w.bytes.slice(0, w.length);
  }

  function decode(bytes) {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    let at = 0;
    const need = (n) => {
      if (at + n > bytes.length) throw new RangeError("msgpack: the value ends early");
    };
    const int64 = (signed) => {
      need(8);
      const big = signed ? view.getBigInt64(at) : view.getBigUint64(at);
      at += 8;
      const small = Number(big);
      return Number.isSafeInteger(small) ? small : big;
    };
    const str = (n) => { need(n); const s = utf8Decoder.decode(bytes.subarray(at, at + n)); at += n; return s; };
    const bin = (n) => { need(n); const b = bytes.slice(at, at + n); at += n; return b; };
    const array = (n) => { const out = new Array(n); for (let i = 0; i < n; i++) out[i] = value(); return out; };
    const map = (n) => {
      const out = {};
      for (let i = 0; i < n; i++) {
        const key = value();
        out[typeof key === "string" ? key : String(key)] = value();
      }
      return out;
    };
    function value() {
      need(1);
      const type = view.getUint8(at); at += 1;
      if (type < 0x80) return type;
      if (type < 0x90) return map(type & 0x0f);
      if (type < 0xa0) return array(type & 0x0f);
      if (type < 0xc0) return str(type & 0x1f);
      if (type >= 0xe0) return type - 0x100;
      switch (type) {
        case 0xc0: return null;
        case 0xc2: return false;
        case 0xc3: return true;
        case 0xc4: need(1); at += 1; return bin(view.getUint8(at - 1));
        case 0xc5: need(2); at += 2; return bin(view.getUint16(at - 2));
        case 0xc6: need(4); at += 4; return bin(view.getUint32(at - 4));
        case 0xca: need(4); at += 4; return view.getFloat32(at - 4);
        case 0xcb: need(8); at += 8; return view.getFloat64(at - 8);
        case 0xcc: need(1); at += 1; return view.getUint8(at - 1);
        case 0xcd: need(2); at += 2; return view.getUint16(at - 2);
        case 0xce: need(4); at += 4; return view.getUint32(at - 4);
        case 0xcf: return int64(false);
        case 0xd0: need(1); at += 1; return view.getInt8(at - 1);
        case 0xd1: need(2); at += 2; return view.getInt16(at - 2);
        case 0xd2: need(4); at += 4; return view.getInt32(at - 4);
        case 0xd3: return int64(true);
        case 0xd9: need(1); at += 1; return str(view.getUint8(at - 1));
        case 0xda: need(2); at += 2; return str(view.getUint16(at - 2));
        case 0xdb: need(4); at += 4; return str(view.getUint32(at - 4));
        case 0xdc: need(2); at += 2; return array(view.getUint16(at - 2));
        case 0xdd: need(4); at += 4; return array(view.getUint32(at - 4));
        case 0xde: need(2); at += 2; return map(view.getUint16(at - 2));
        case 0xdf: need(4); at += 4; return map(view.getUint32(at - 4));
        default: throw new TypeError(`msgpack: type byte 0x${type.toString(16)} is not supported`);
      }
    }
    const result = value();
    if (at !== bytes.length) throw new RangeError("msgpack: bytes left after the value");
    return result;
  }

  return { encode, decode };
})();
