// qr.js — a small QR Code encoder (ISO/IEC 18004): byte mode, error correction level M,
// versions 1 to 15 (up to 412 bytes: a shared subscription link), as an SVG element built
// with DOM calls. No network, no dependency. The algorithm follows the standard's steps:
// segment bits, Reed–Solomon blocks over GF(256), interleaving, function patterns, zig-zag
// placement, the mask with the lowest penalty, format and version bits.

// Level M per version: [EC codewords per block, blocks of group 1, data codewords of each,
// blocks of group 2 (each with one more data codeword)].
const BLOCKS_M = [
  null,
  [10, 1, 16, 0], [16, 1, 28, 0], [26, 1, 44, 0], [18, 2, 32, 0], [24, 2, 43, 0],
  [16, 4, 27, 0], [18, 4, 31, 0], [22, 2, 38, 2], [22, 3, 36, 2], [26, 4, 43, 1],
  [30, 1, 50, 4], [22, 6, 36, 2], [22, 8, 37, 1], [24, 4, 40, 5], [24, 5, 41, 5],
];
export const MAX_VERSION = BLOCKS_M.length - 1;
const FORMAT_BITS_M = 0; // level M's two bits in the format information

function dataCapacity(version) {
  const [, g1, d1, g2] = BLOCKS_M[version];
  return g1 * d1 + g2 * (d1 + 1);
}

function gfMul(x, y) {
  let z = 0;
  for (let i = 7; i >= 0; i--) {
    z = (z << 1) ^ ((z >>> 7) * 0x11d);
    z ^= ((y >>> i) & 1) * x;
  }
  return z;
}

function rsDivisor(degree) {
  const result = new Array(degree).fill(0);
  result[degree - 1] = 1;
  let root = 1;
  for (let i = 0; i < degree; i++) {
    for (let j = 0; j < result.length; j++) {
      result[j] = gfMul(result[j], root);
      if (j + 1 < result.length) result[j] ^= result[j + 1];
    }
    root = gfMul(root, 0x02);
  }
  return result;
}

function rsRemainder(data, divisor) {
  const result = divisor.map(() => 0);
  for (const b of data) {
    const factor = b ^ result.shift();
    result.push(0);
    divisor.forEach((coef, i) => (result[i] ^= gfMul(coef, factor)));
  }
  return result;
}

/** The codewords of *bytes* in *version* (level M): data and error correction, interleaved. */
function codewords(bytes, version) {
  const bits = [];
  const put = (value, n) => {
    for (let i = n - 1; i >= 0; i--) bits.push((value >>> i) & 1);
  };
  put(0b0100, 4); // byte mode
  put(bytes.length, version <= 9 ? 8 : 16);
  for (const b of bytes) put(b, 8);
  const capacity = dataCapacity(version) * 8;
  put(0, Math.min(4, capacity - bits.length));
  put(0, (8 - (bits.length % 8)) % 8);
  for (let pad = 0xec; bits.length < capacity; pad ^= 0xec ^ 0x11) put(pad, 8);
  const data = [];
  for (let i = 0; i < bits.length; i += 8) data.push(bits.slice(i, i + 8).reduce((a, b) => (a << 1) | b, 0));

  const [ecLen, g1, d1, g2] = BLOCKS_M[version];
  const divisor = rsDivisor(ecLen);
  const blocks = [];
  let k = 0;
  for (let i = 0; i < g1 + g2; i++) {
    const len = i < g1 ? d1 : d1 + 1;
    const part = data.slice(k, k + len);
    k += len;
    blocks.push({ data: part, ec: rsRemainder(part, divisor) });
  }
  const out = [];
  for (let i = 0; i <= d1; i++) for (const b of blocks) if (i < b.data.length) out.push(b.data[i]);
  for (let i = 0; i < ecLen; i++) for (const b of blocks) out.push(b.ec[i]);
  return out;
}

function alignmentPositions(version) {
  if (version === 1) return [];
  const n = Math.floor(version / 7) + 2;
  const size = version * 4 + 17;
  const step = Math.ceil((version * 4 + 4) / (n * 2 - 2)) * 2;
  const out = [6];
  for (let pos = size - 7; out.length < n; pos -= step) out.splice(1, 0, pos);
  return out;
}

const MASKS = [
  (x, y) => (x + y) % 2 === 0,
  (x, y) => y % 2 === 0,
  (x) => x % 3 === 0,
  (x, y) => (x + y) % 3 === 0,
  (x, y) => (Math.floor(x / 3) + Math.floor(y / 2)) % 2 === 0,
  (x, y) => ((x * y) % 2) + ((x * y) % 3) === 0,
  (x, y) => (((x * y) % 2) + ((x * y) % 3)) % 2 === 0,
  (x, y) => (((x + y) % 2) + ((x * y) % 3)) % 2 === 0,
];

class Grid {
  constructor(version) {
    this.version = version;
    this.size = version * 4 + 17;
    this.dark = Array.from({ length: this.size }, () => new Array(this.size).fill(false));
    this.fixed = Array.from({ length: this.size }, () => new Array(this.size).fill(false));
  }

  set(x, y, dark) {
    this.dark[y][x] = dark;
    this.fixed[y][x] = true;
  }

  functionPatterns() {
    const s = this.size;
    for (let i = 0; i < s; i++) {
      this.set(6, i, i % 2 === 0);
      this.set(i, 6, i % 2 === 0);
    }
    for (const [cx, cy] of [[3, 3], [s - 4, 3], [3, s - 4]]) {
      for (let dy = -4; dy <= 4; dy++) {
        for (let dx = -4; dx <= 4; dx++) {
          const d = Math.max(Math.abs(dx), Math.abs(dy));
          const x = cx + dx;
          const y = cy + dy;
          if (x >= 0 && x < s && y >= 0 && y < s) this.set(x, y, d !== 2 && d !== 4);
        }
      }
    }
    const align = alignmentPositions(this.version);
    const last = align.length - 1;
    align.forEach((ax, i) =>
      align.forEach((ay, j) => {
        if ((i === 0 && j === 0) || (i === 0 && j === last) || (i === last && j === 0)) return;
        for (let dy = -2; dy <= 2; dy++)
          for (let dx = -2; dx <= 2; dx++) this.set(ax + dx, ay + dy, Math.max(Math.abs(dx), Math.abs(dy)) !== 1);
      }),
    );
    this.formatBits(0); // reserves the format areas; drawn again once the mask is known
    if (this.version >= 7) {
      let rem = this.version;
      for (let i = 0; i < 12; i++) rem = (rem << 1) ^ ((rem >>> 11) * 0x1f25);
      const bits = (this.version << 12) | rem;
      for (let i = 0; i < 18; i++) {
        const bit = ((bits >>> i) & 1) === 1;
        const a = s - 11 + (i % 3);
        const b = Math.floor(i / 3);
        this.set(a, b, bit);
        this.set(b, a, bit);
      }
    }
  }

  formatBits(mask) {
    const s = this.size;
    const data = (FORMAT_BITS_M << 3) | mask;
    let rem = data;
    for (let i = 0; i < 10; i++) rem = (rem << 1) ^ ((rem >>> 9) * 0x537);
    const bits = ((data << 10) | rem) ^ 0x5412;
    const bit = (i) => ((bits >>> i) & 1) === 1;
    for (let i = 0; i <= 5; i++) this.set(8, i, bit(i));
    this.set(8, 7, bit(6));
    this.set(8, 8, bit(7));
    this.set(7, 8, bit(8));
    for (let i = 9; i < 15; i++) this.set(14 - i, 8, bit(i));
    for (let i = 0; i < 8; i++) this.set(s - 1 - i, 8, bit(i));
    for (let i = 8; i < 15; i++) this.set(8, s - 15 + i, bit(i));
    this.set(8, s - 8, true); // the dark module
  }

  place(data) {
    const s = this.size;
    let i = 0;
    for (let right = s - 1; right >= 1; right -= 2) {
      if (right === 6) right = 5;
      for (let vert = 0; vert < s; vert++) {
        for (let j = 0; j < 2; j++) {
          const x = right - j;
          const upward = ((right + 1) & 2) === 0;
          const y = upward ? s - 1 - vert : vert;
          if (!this.fixed[y][x] && i < data.length * 8) {
            this.dark[y][x] = ((data[i >>> 3] >>> (7 - (i & 7))) & 1) === 1;
            i++;
          }
        }
      }
    }
  }

  applyMask(mask) {
    const f = MASKS[mask];
    for (let y = 0; y < this.size; y++)
      for (let x = 0; x < this.size; x++) if (!this.fixed[y][x] && f(x, y)) this.dark[y][x] = !this.dark[y][x];
  }

  /** Rules 1, 2 and 4 of the standard's penalty (runs, blocks, balance): enough to pick a
   * readable mask; any mask decodes. */
  penalty() {
    const s = this.size;
    let score = 0;
    let darkCount = 0;
    for (let pass = 0; pass < 2; pass++) {
      for (let a = 0; a < s; a++) {
        let run = 1;
        for (let b = 1; b <= s; b++) {
          const same = b < s && (pass ? this.dark[b][a] === this.dark[b - 1][a] : this.dark[a][b] === this.dark[a][b - 1]);
          if (same) run++;
          else {
            if (run >= 5) score += run - 2;
            run = 1;
          }
        }
      }
    }
    for (let y = 0; y < s; y++) {
      for (let x = 0; x < s; x++) {
        if (this.dark[y][x]) darkCount++;
        if (x + 1 < s && y + 1 < s) {
          const c = this.dark[y][x];
          if (c === this.dark[y][x + 1] && c === this.dark[y + 1][x] && c === this.dark[y + 1][x + 1]) score += 3;
        }
      }
    }
    score += Math.floor(Math.abs(darkCount * 20 - s * s * 10) / (s * s)) * 10;
    return score;
  }
}

/**
 * The modules of *text*'s QR code: rows of booleans (true: dark), without the quiet zone.
 * `version` and `mask` force those (for tests); by default the smallest version that holds
 * the text, and the mask with the lowest penalty. Throws RangeError past version 15.
 */
export function qrMatrix(text, { version = null, mask = null } = {}) {
  const bytes = new TextEncoder().encode(text);
  let v = version;
  if (v === null) {
    v = 1;
    while (v <= MAX_VERSION && Math.ceil((4 + (v <= 9 ? 8 : 16) + bytes.length * 8) / 8) > dataCapacity(v)) v++;
  }
  if (v > MAX_VERSION) throw new RangeError(`too long for a QR code here (${bytes.length} bytes)`);
  const data = codewords(bytes, v);
  let best = null;
  for (const m of mask === null ? [0, 1, 2, 3, 4, 5, 6, 7] : [mask]) {
    const g = new Grid(v);
    g.functionPatterns();
    g.place(data);
    g.applyMask(m);
    g.formatBits(m);
    const p = mask === null ? g.penalty() : 0;
    if (best === null || p < best.p) best = { g, p };
  }
  return best.g.dark;
}

/** An SVG element drawing *text*'s QR code (dark on white, with its 4-module quiet zone). */
export function qrSvg(text, { pixels = 240 } = {}) {
  const rows = qrMatrix(text);
  const n = rows.length + 8;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${n} ${n}`);
  svg.setAttribute("width", String(pixels));
  svg.setAttribute("height", String(pixels));
  svg.setAttribute("shape-rendering", "crispEdges");
  const bg = document.createElementNS(ns, "rect");
  bg.setAttribute("width", String(n));
  bg.setAttribute("height", String(n));
  bg.setAttribute("fill", "#fff");
  svg.append(bg);
  let d = "";
  rows.forEach((row, y) => row.forEach((dark, x) => dark && (d += `M${x + 4} ${y + 4}h1v1h-1z`)));
  const path = document.createElementNS(ns, "path");
  path.setAttribute("d", d);
  path.setAttribute("fill", "#000");
  svg.append(path);
  return svg;
}
