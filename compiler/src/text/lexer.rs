//! On-demand lexer over the source bytes: the parser asks for the token it expects next, which
//! is how MLIR's context-sensitive pieces (dimension lists, `{-#`) are handled. Every method
//! stops only at ASCII bytes, so positions stay on UTF-8 character boundaries.

use crate::error::Error;

/// Kind of a numeric literal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NumKind {
    /// `-?[0-9]+`
    Int,
    /// `0x[0-9a-fA-F]+`
    Hex,
    /// `-?[0-9]+.[0-9]*([eE][+-]?[0-9]+)?`
    Float,
}

/// A numeric literal: its text and kind.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Num<'a> {
    pub text: &'a str,
    pub kind: NumKind,
    pub pos: usize,
}

/// The lexer state: the source and a byte position.
pub(crate) struct Lexer<'a> {
    src: &'a str,
    b: &'a [u8],
    pub pos: usize,
    file: &'a str,
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str, file: &'a str) -> Self {
        Lexer {
            src,
            b: src.as_bytes(),
            pos: 0,
            file,
        }
    }

    /// A parse error at byte `pos`.
    pub fn err_at(&self, pos: usize, msg: impl Into<String>) -> Error {
        let pos = pos.min(self.b.len());
        let before = &self.b[..pos];
        let line = before.iter().filter(|c| **c == b'\n').count() + 1;
        let start = before
            .iter()
            .rposition(|c| *c == b'\n')
            .map_or(0, |i| i + 1);
        let col = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
        Error::Parse {
            file: self.file.to_string(),
            line,
            col,
            msg: msg.into(),
        }
    }

    /// A parse error at the current position (after whitespace), naming what is there.
    pub fn err(&mut self, msg: impl Into<String>) -> Error {
        self.skip_ws();
        let msg = format!("{}, found {}", msg.into(), self.describe());
        self.err_at(self.pos, msg)
    }

    /// A short description of the text at the current position.
    fn describe(&self) -> String {
        let rest = self.src.get(self.pos..).unwrap_or("");
        let Some(c) = rest.chars().next() else {
            return "end of input".to_string();
        };
        if c.is_ascii_alphanumeric() || c == '_' {
            let w: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$'))
                .take(40)
                .collect();
            format!("'{w}'")
        } else {
            format!("'{}'", c.escape_debug())
        }
    }

    /// Skip whitespace and `//` comments.
    pub fn skip_ws(&mut self) {
        loop {
            while self.pos < self.b.len() && self.b[self.pos].is_ascii_whitespace() {
                self.pos += 1;
            }
            if self.b[self.pos.min(self.b.len())..].starts_with(b"//") {
                while self.pos < self.b.len() && self.b[self.pos] != b'\n' {
                    self.pos += 1;
                }
            } else {
                return;
            }
        }
    }

    /// The next byte after whitespace.
    pub fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.b.get(self.pos).copied()
    }

    /// The byte at the current position, no whitespace skipping.
    pub fn peek_raw(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    /// True at end of input (after whitespace).
    pub fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }

    /// Consume `s` (after whitespace) if it is next.
    pub fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        if self.b[self.pos..].starts_with(s.as_bytes()) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// Consume `s` or fail.
    pub fn expect(&mut self, s: &str) -> Result<(), Error> {
        if self.eat(s) {
            Ok(())
        } else {
            Err(self.err(format!("expected '{s}'")))
        }
    }

    /// Consume `s` with no whitespace before it, or fail.
    pub fn expect_raw(&mut self, s: &str) -> Result<(), Error> {
        if self.b[self.pos..].starts_with(s.as_bytes()) {
            self.pos += s.len();
            Ok(())
        } else {
            let msg = format!("expected '{s}', found {}", self.describe());
            Err(self.err_at(self.pos, msg))
        }
    }

    /// Length of the identifier `[A-Za-z_][A-Za-z0-9_$.]*` at the current position (0 if none).
    fn ident_len(&self) -> usize {
        let rest = &self.b[self.pos..];
        match rest.first() {
            Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {}
            _ => return 0,
        }
        rest.iter()
            .position(|c| !(c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.')))
            .unwrap_or(rest.len())
    }

    /// An identifier (bare-id, after whitespace), if one is next.
    pub fn ident(&mut self) -> Option<&'a str> {
        self.skip_ws();
        let n = self.ident_len();
        if n == 0 {
            return None;
        }
        let s = self.src.get(self.pos..self.pos + n)?;
        self.pos += n;
        Some(s)
    }

    /// Consume the keyword `kw` if it is the whole identifier that is next.
    pub fn eat_keyword(&mut self, kw: &str) -> bool {
        self.skip_ws();
        let n = self.ident_len();
        if n == kw.len() && self.b[self.pos..].starts_with(kw.as_bytes()) {
            self.pos += n;
            true
        } else {
            false
        }
    }

    /// An SSA suffix id right after `%`: `[0-9]+` or `[A-Za-z$._-][A-Za-z0-9$._-]*`.
    pub fn suffix_id(&mut self) -> Result<&'a str, Error> {
        let start = self.pos;
        let rest = &self.b[self.pos..];
        let n = match rest.first() {
            Some(c) if c.is_ascii_digit() => rest
                .iter()
                .position(|c| !c.is_ascii_digit())
                .unwrap_or(rest.len()),
            Some(c) if c.is_ascii_alphabetic() || matches!(c, b'$' | b'.' | b'_' | b'-') => rest
                .iter()
                .position(|c| {
                    !(c.is_ascii_alphanumeric() || matches!(c, b'$' | b'.' | b'_' | b'-'))
                })
                .unwrap_or(rest.len()),
            _ => 0,
        };
        if n == 0 {
            let msg = format!("expected a value name after '%', found {}", self.describe());
            return Err(self.err_at(start, msg));
        }
        self.pos += n;
        Ok(self.src.get(start..start + n).unwrap_or(""))
    }

    /// A string literal (after whitespace), unescaped to bytes.
    pub fn string(&mut self) -> Result<Vec<u8>, Error> {
        self.skip_ws();
        let start = self.pos;
        if self.peek_raw() != Some(b'"') {
            return Err(self.err("expected a string literal"));
        }
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.b.get(self.pos) else {
                return Err(self.err_at(start, "unterminated string literal"));
            };
            match c {
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\n' => return Err(self.err_at(start, "unterminated string literal")),
                b'\\' => {
                    let esc = self.pos;
                    let e = self.b.get(self.pos + 1).copied();
                    match e {
                        Some(b'"') | Some(b'\\') => {
                            out.push(e.unwrap_or(b'"'));
                            self.pos += 2;
                        }
                        Some(b'n') => {
                            out.push(b'\n');
                            self.pos += 2;
                        }
                        Some(b't') => {
                            out.push(b'\t');
                            self.pos += 2;
                        }
                        _ => {
                            let h = |c: Option<&u8>| c.and_then(|c| (*c as char).to_digit(16));
                            match (h(self.b.get(self.pos + 1)), h(self.b.get(self.pos + 2))) {
                                (Some(a), Some(b)) => {
                                    out.push((a * 16 + b) as u8);
                                    self.pos += 3;
                                }
                                _ => return Err(self.err_at(esc, "bad escape in string literal")),
                            }
                        }
                    }
                }
                _ => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    /// True if a number starts here (after whitespace).
    pub fn at_number(&mut self) -> bool {
        self.skip_ws();
        match self.peek_raw() {
            Some(c) if c.is_ascii_digit() => true,
            Some(b'-') => self.b.get(self.pos + 1).is_some_and(|c| c.is_ascii_digit()),
            _ => false,
        }
    }

    /// A numeric literal (after whitespace).
    pub fn number(&mut self) -> Result<Num<'a>, Error> {
        self.skip_ws();
        let start = self.pos;
        let digits = |l: &Self, p: usize| {
            l.b[p.min(l.b.len())..]
                .iter()
                .position(|c| !c.is_ascii_digit())
                .unwrap_or(l.b.len().saturating_sub(p))
        };
        if self.b[self.pos..].starts_with(b"0x") {
            let rest = &self.b[self.pos + 2..];
            let n = rest
                .iter()
                .position(|c| !c.is_ascii_hexdigit())
                .unwrap_or(rest.len());
            if n == 0 {
                return Err(self.err_at(start, "expected hex digits after '0x'"));
            }
            self.pos += 2 + n;
            return Ok(Num {
                text: self.src.get(start..self.pos).unwrap_or(""),
                kind: NumKind::Hex,
                pos: start,
            });
        }
        let mut p = self.pos;
        if self.b.get(p) == Some(&b'-') {
            p += 1;
        }
        let n = digits(self, p);
        if n == 0 {
            return Err(self.err("expected a number"));
        }
        p += n;
        let mut kind = NumKind::Int;
        if self.b.get(p) == Some(&b'.') {
            kind = NumKind::Float;
            p += 1;
            p += digits(self, p);
            if matches!(self.b.get(p), Some(b'e') | Some(b'E')) {
                let mut q = p + 1;
                if matches!(self.b.get(q), Some(b'+') | Some(b'-')) {
                    q += 1;
                }
                let n = digits(self, q);
                if n > 0 {
                    p = q + n;
                }
            }
        }
        self.pos = p;
        Ok(Num {
            text: self.src.get(start..p).unwrap_or(""),
            kind,
            pos: start,
        })
    }

    /// Digits `[0-9]+` with no whitespace before them, as an i64.
    pub fn raw_int(&mut self) -> Result<i64, Error> {
        let start = self.pos;
        let rest = &self.b[self.pos..];
        let n = rest
            .iter()
            .position(|c| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let text = self.src.get(start..start + n).unwrap_or("");
        let v = text
            .parse::<i64>()
            .map_err(|_| self.err_at(start, "expected an integer"))?;
        self.pos += n;
        Ok(v)
    }

    /// Raw bytes from the current position while `f` holds (no whitespace skipping).
    pub fn take_while(&mut self, f: impl Fn(u8) -> bool) -> &'a str {
        let start = self.pos;
        while self.pos < self.b.len() && f(self.b[self.pos]) {
            self.pos += 1;
        }
        self.src.get(start..self.pos).unwrap_or("")
    }

    /// The source text between two positions ("" if not on character boundaries).
    pub fn src_slice(&self, a: usize, b: usize) -> &'a str {
        self.src.get(a..b).unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        let mut lx = Lexer::new("  -12 0x7FC00000 1.5e-3 2. 3 // c\n 1.0E+20x", "t");
        let kinds: Vec<(String, NumKind)> = (0..6)
            .map(|_| {
                let n = lx.number().unwrap();
                (n.text.to_string(), n.kind)
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("-12".into(), NumKind::Int),
                ("0x7FC00000".into(), NumKind::Hex),
                ("1.5e-3".into(), NumKind::Float),
                ("2.".into(), NumKind::Float),
                ("3".into(), NumKind::Int),
                ("1.0E+20".into(), NumKind::Float),
            ]
        );
        assert_eq!(lx.peek(), Some(b'x'));
        assert!(Lexer::new("-", "t").number().is_err());
        assert!(Lexer::new("0x", "t").number().is_err());
    }

    #[test]
    fn strings_and_positions() {
        let mut lx = Lexer::new("\"a\\\"b\\\\\\0A\\n\\t\\C3\\A9\"", "t");
        assert_eq!(lx.string().unwrap(), b"a\"b\\\n\n\t\xC3\xA9");
        let mut lx = Lexer::new("\n  \u{e9}\u{e9} \"abc", "f");
        lx.skip_ws();
        lx.pos += 5;
        match lx.string() {
            Err(Error::Parse { line, col, .. }) => assert_eq!((line, col), (2, 6)),
            other => panic!("{other:?}"),
        }
        assert!(Lexer::new("\"\\zz\"", "t").string().is_err());
    }

    #[test]
    fn identifiers() {
        let mut lx = Lexer::new("func.func@x %a-b.c$9#1", "t");
        assert!(lx.eat_keyword("func.func"));
        assert!(lx.eat("@"));
        assert_eq!(lx.ident(), Some("x"));
        assert!(lx.eat("%"));
        assert_eq!(lx.suffix_id().unwrap(), "a-b.c$9");
        assert_eq!(lx.peek_raw(), Some(b'#'));
        let mut lx = Lexer::new("returnx", "t");
        assert!(!lx.eat_keyword("return"));
    }
}
