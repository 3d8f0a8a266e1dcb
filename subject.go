package mq

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// TenantID identifies a tenant. It is one subject token: a lowercase letter or digit,
// then up to 63 lowercase letters, digits, '_' or '-'.
type TenantID string

// maxTenantLen is the longest tenant id in bytes.
const maxTenantLen = 64

// maxKeyLen bounds an escaped topic key, so every subject built from it stays well
// inside NATS's 4 KiB control line together with the prefix and a reply subject.
const maxKeyLen = 2048

// Validate reports whether t is a valid tenant id; the error wraps ErrInvalidTenant.
func (t TenantID) Validate() error {
	if t == "" {
		return fmt.Errorf("%w: empty", ErrInvalidTenant)
	}
	if len(t) > maxTenantLen {
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidTenant, len(t), maxTenantLen)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if isLowerAlnum(c) || (i > 0 && (c == '_' || c == '-')) {
			continue
		}
		return fmt.Errorf("%w: %q: byte %s at index %d is not allowed", ErrInvalidTenant, string(t), quoteByte(c), i)
	}
	return nil
}

// quoteByte shows a printable ASCII byte quoted and any other byte in hex, so a byte of
// a UTF-8 sequence is not shown as a Latin-1 character.
func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("%#02x", c)
}

func isLowerAlnum(c byte) bool { return ('a' <= c && c <= 'z') || ('0' <= c && c <= '9') }

// keptByte reports whether the escaping writes c as itself. The set is frozen: keys are
// stored in subjects, so changing it would orphan what is stored.
func keptByte(c byte) bool {
	return isLowerAlnum(c) || ('A' <= c && c <= 'Z') || c == '_' || c == '-'
}

const upperHex = "0123456789ABCDEF"

// appendEscaped writes s as one subject token: kept bytes as themselves, every other
// byte (including '.', '*', '>', '%', space and each byte of non-ASCII) as %XX.
// Because '%' itself is escaped, the escaping is injective.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keptByte(c) {
			b = append(b, c)
			continue
		}
		b = append(b, '%', upperHex[c>>4], upperHex[c&0x0f])
	}
	return b
}

var errBadEscape = errors.New("malformed escape")

// unescape reverses appendEscaped, strictly: only uppercase %XX of a byte that would
// have been escaped is accepted, so every token has exactly one meaning.
func unescape(tok string) (string, error) {
	if !strings.ContainsRune(tok, '%') {
		for i := 0; i < len(tok); i++ {
			if !keptByte(tok[i]) {
				return "", fmt.Errorf("%w: byte %q at %d", errBadEscape, tok[i], i)
			}
		}
		return tok, nil
	}
	b := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if keptByte(c) {
			b = append(b, c)
			continue
		}
		if c != '%' || i+2 >= len(tok) {
			return "", fmt.Errorf("%w: %q at %d", errBadEscape, tok, i)
		}
		hi, lo := strings.IndexByte(upperHex, tok[i+1]), strings.IndexByte(upperHex, tok[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("%w: %q at %d", errBadEscape, tok, i)
		}
		v := byte(hi<<4 | lo)
		if keptByte(v) {
			return "", fmt.Errorf("%w: %q escapes a byte kept as itself at %d", errBadEscape, tok, i)
		}
		b = append(b, v)
		i += 2
	}
	return string(b), nil
}

// Validate reports whether t can be published: a valid tenant, a non-empty table, and
// an encoded key no longer than 2048 bytes. The error wraps ErrInvalidTopic.
func (t Topic) Validate() error {
	_, err := t.Key()
	return err
}

// Key returns the topic key, the tail of every subject the topic is stored under:
// "<tenant>.<escaped table>[.<escaped scope>]". Distinct topics never share a key, and
// ParseTopicKey(key) returns the topic again. The error wraps ErrInvalidTopic.
func (t Topic) Key() (string, error) {
	if err := t.check(); err != nil {
		return "", err
	}
	b, err := t.appendKey(make([]byte, 0, len(t.Tenant)+1+len(t.Table)+len(t.Scope)+8))
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// check refuses a topic with an invalid tenant or no table.
func (t Topic) check() error {
	if err := t.Tenant.Validate(); err != nil {
		return fmt.Errorf("%w: tenant: %w", ErrInvalidTopic, err)
	}
	if t.Table == "" {
		return fmt.Errorf("%w: tenant %s: empty table", ErrInvalidTopic, t.Tenant)
	}
	return nil
}

// appendKey appends t's key to dst; t must be valid but for the key's length, which
// it checks.
func (t Topic) appendKey(dst []byte) ([]byte, error) {
	start := len(dst)
	dst = append(dst, t.Tenant...)
	dst = append(dst, '.')
	dst = appendEscaped(dst, t.Table)
	if t.Scope != "" {
		dst = append(dst, '.')
		dst = appendEscaped(dst, t.Scope)
	}
	if n := len(dst) - start; n > maxKeyLen {
		return nil, fmt.Errorf("%w: tenant %s: encoded key is %d bytes, longer than %d",
			ErrInvalidTopic, t.Tenant, n, maxKeyLen)
	}
	return dst, nil
}

// String returns the topic key, or a readable form of an invalid topic.
func (t Topic) String() string {
	if k, err := t.Key(); err == nil {
		return k
	}
	return fmt.Sprintf("{tenant %q table %q scope %q}", string(t.Tenant), t.Table, t.Scope)
}

// ParseTopicKey decodes a key written by Topic.Key. Any other string is an error
// wrapping ErrInvalidTopic.
func ParseTopicKey(key string) (Topic, error) {
	if len(key) > maxKeyLen {
		return Topic{}, fmt.Errorf("%w: key is %d bytes, longer than %d", ErrInvalidTopic, len(key), maxKeyLen)
	}
	toks := strings.Split(key, ".")
	if len(toks) < 2 || len(toks) > 3 {
		return Topic{}, fmt.Errorf("%w: key %q has %d tokens, want 2 or 3", ErrInvalidTopic, key, len(toks))
	}
	t := Topic{Tenant: TenantID(toks[0])}
	if err := t.Tenant.Validate(); err != nil {
		return Topic{}, fmt.Errorf("%w: key %q: %w", ErrInvalidTopic, key, err)
	}
	var err error
	if t.Table, err = unescape(toks[1]); err != nil || t.Table == "" {
		return Topic{}, fmt.Errorf("%w: key %q: table: %v", ErrInvalidTopic, key, orEmpty(err))
	}
	if len(toks) == 3 {
		if t.Scope, err = unescape(toks[2]); err != nil || t.Scope == "" {
			return Topic{}, fmt.Errorf("%w: key %q: scope: %v", ErrInvalidTopic, key, orEmpty(err))
		}
	}
	return t, nil
}

func orEmpty(err error) error {
	if err == nil {
		return errors.New("empty")
	}
	return err
}

// Partition returns the ingest partition of tenant among n: fnv32a(tenant) % n, the
// hash NATS's own partition() subject mapping uses, so a server-side mapping could
// take over without moving any tenant.
func Partition(tenant TenantID, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(tenant))
	return int(h.Sum32() % uint32(n))
}

// subjects builds and parses the subjects of one topology prefix.
type subjects struct {
	prefix string
	n      int
}

// ingest returns the ingest subject of key on partition p.
func (s subjects) ingest(p int, key string) string {
	return s.prefix + ".ingest." + strconv.Itoa(p) + "." + key
}

// ingestTopic returns the ingest subject of t and its partition.
func (s subjects) ingestTopic(t Topic) (subject string, partition int, err error) {
	if err := t.check(); err != nil {
		return "", 0, err
	}
	// Built in place on the stack, one allocation for the subject (measured: two with
	// the key built first).
	p := Partition(t.Tenant, s.n)
	var buf [256]byte
	b := append(buf[:0], s.prefix...)
	b = append(b, ".ingest."...)
	b = strconv.AppendInt(b, int64(p), 10)
	b = append(b, '.')
	if b, err = t.appendKey(b); err != nil {
		return "", 0, err
	}
	return string(b), p, nil
}

// partitionFilter is the subject filter of partition p: "<prefix>.ingest.<p>.>".
func (s subjects) partitionFilter(p int) string {
	return s.prefix + ".ingest." + strconv.Itoa(p) + ".>"
}

// ingestAll matches every ingest subject.
func (s subjects) ingestAll() string { return s.prefix + ".ingest.>" }

// tenantIngest matches every ingest subject of tenant, on its partition.
func (s subjects) tenantIngest(tenant TenantID) string {
	return s.prefix + ".ingest." + strconv.Itoa(Partition(tenant, s.n)) + "." + string(tenant) + ".>"
}

// deadLetter returns the dead-letter subject of key: a prefix swap of the ingest one.
func (s subjects) deadLetter(key string) string { return s.prefix + ".dlq." + key }

// deadLetterAll matches every dead-letter subject.
func (s subjects) deadLetterAll() string { return s.prefix + ".dlq.>" }

// tenantDeadLetters matches every dead-letter subject of tenant.
func (s subjects) tenantDeadLetters(tenant TenantID) string {
	return s.prefix + ".dlq." + string(tenant) + ".>"
}

// key returns the topic key a subject of this prefix carries: the tail after
// "<prefix>.dlq." or after "<prefix>.ingest.<p>.", where p is a decimal below 2^31.
// ok is false for a subject this prefix did not write.
func (s subjects) key(subject string) (key string, ok bool) {
	// Cut in two steps: s.prefix+"." built a string on every delivery.
	rest, found := strings.CutPrefix(subject, s.prefix)
	if !found || !strings.HasPrefix(rest, ".") {
		return "", false
	}
	rest = rest[1:]
	if k, found := strings.CutPrefix(rest, "dlq."); found {
		return k, k != ""
	}
	rest, found = strings.CutPrefix(rest, "ingest.")
	if !found {
		return "", false
	}
	p, k, found := strings.Cut(rest, ".")
	if !found || k == "" || p == "" || (len(p) > 1 && p[0] == '0') {
		return "", false
	}
	if _, err := strconv.ParseUint(p, 10, 31); err != nil {
		return "", false
	}
	return k, true
}

// keyOrSubject returns the subject's topic key, or the whole subject when it is not one
// this prefix wrote, so a foreign event is never dropped.
func (s subjects) keyOrSubject(subject string) string {
	if k, ok := s.key(subject); ok {
		return k
	}
	return subject
}
