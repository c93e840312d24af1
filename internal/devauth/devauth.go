// Package devauth is a local JWT issuer for development: it stands in for the
// identity provider whose tokens API Gateway's JWT authorizer (BuyerJwt in
// template.yaml) checks in AWS. It keeps one RS256 key pair in a directory
// (.holdfast/dev/jwt unless told), created on first use: the private key as
// PKCS #8 PEM readable by its owner only, the public key as a JWKS.
//
// An Issuer mints tokens with iss, aud, sub, iat, nbf and exp, signed with a
// kid (the key's RFC 7638 thumbprint); a Verifier checks them the way the
// authorizer does — an RS256 signature by a key of the JWKS named by kid,
// iss, aud (or client_id when aud is absent), exp, nbf and iat with a small
// leeway — and returns the claims as API Gateway hands them to the Lambda.
// RS256 because HTTP API JWT authorizers accept only RSA-based algorithms.
//
// The keys, the minting and the claims' checks are
// github.com/go-jose/go-jose/v4's and the signature's check crypto/rsa's;
// Verify parses the compact RS256 form itself (verifySignature), the one
// form a JWT authorizer takes. Nothing here is cryptography of its own.
package devauth

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

const (
	// IssuerURL is the iss of every dev token (the JwtIssuer of `make dev`).
	IssuerURL = "http://127.0.0.1:3000/dev-issuer"
	// Audience is the aud of every dev token (the JwtAudience of `make dev`).
	Audience = "holdfast-dev"
	// DefaultDir is where `make dev`, `make token` and the load tool keep the key.
	DefaultDir = ".holdfast/dev/jwt"
	// Leeway is the clock skew a Verifier tolerates on exp, nbf and iat.
	Leeway = time.Minute

	keyFile  = "private.pem"
	jwksFile = "jwks.json"
	keyBits  = 2048
)

// ErrInvalidToken is wrapped by every error of Verify: the request is
// unauthorized. The go-jose cause (jwt.ErrExpired, jwt.ErrInvalidAudience,
// jose.ErrCryptoFailure, …) is wrapped too when there is one.
var ErrInvalidToken = errors.New("devauth: invalid token")

// Issuer mints dev tokens with its key. Set the fields before use only.
type Issuer struct {
	Issuer   string           // iss of minted tokens; Open sets IssuerURL
	Audience string           // aud of minted tokens; Open sets Audience
	Now      func() time.Time // the clock of iat, nbf and exp; Open sets time.Now

	pub    jose.JSONWebKey
	jwks   []byte
	signer jose.Signer
}

// Open returns the issuer whose key lives in dir, creating the directory
// (0700), the private key (0600) and the JWKS on first use. Two processes
// opening the same new dir at once end up with the same key.
func Open(dir string) (*Issuer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devauth: %w", err)
	}
	path := filepath.Join(dir, keyFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		b, err = createKey(dir, path)
	}
	if err != nil {
		return nil, fmt.Errorf("devauth: %w", err)
	}
	key, err := parseKey(b)
	if err != nil {
		return nil, fmt.Errorf("devauth: %s: %w", path, err)
	}
	pub := jose.JSONWebKey{Key: &key.PublicKey, Algorithm: string(jose.RS256), Use: "sig"}
	thumb, err := pub.Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("devauth: %w", err)
	}
	pub.KeyID = base64.RawURLEncoding.EncodeToString(thumb)
	jwks, err := json.MarshalIndent(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{pub}}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("devauth: %w", err)
	}
	jwks = append(jwks, '\n')
	if err := writeIfChanged(filepath.Join(dir, jwksFile), jwks); err != nil {
		return nil, fmt.Errorf("devauth: %w", err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: pub.KeyID}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return nil, fmt.Errorf("devauth: %w", err)
	}
	return &Issuer{Issuer: IssuerURL, Audience: Audience, Now: time.Now, pub: pub, jwks: jwks, signer: signer}, nil
}

// createKey writes a new private key to path unless another process got
// there first, and returns the PEM that path holds.
func createKey(dir, path string) ([]byte, error) {
	key, err := rsa.GenerateKey(rand.Reader, keyBits)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	tmp, err := os.CreateTemp(dir, ".private-*.pem") // mode 0600
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	// A hard link never replaces: the first process to link wins, the others read its key.
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		return os.ReadFile(path)
	} else if err != nil {
		return nil, err
	}
	return b, nil
}

func parseKey(b []byte) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("not a PKCS #8 PEM private key")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	rk, ok := k.(*rsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, want an RSA key", k)
	}
	return rk, nil
}

// writeIfChanged replaces path with b (0644) unless it holds b already.
func writeIfChanged(path string, b []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".jwks-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// KeyID returns the kid minted tokens carry.
func (i *Issuer) KeyID() string { return i.pub.KeyID }

// JWKS returns the public key set (what jwks.json holds).
func (i *Issuer) JWKS() []byte { return append([]byte(nil), i.jwks...) }

// Verifier returns a Verifier of this issuer's key expecting the issuer and
// audience it mints (IssuerURL and Audience unless changed).
func (i *Issuer) Verifier() *Verifier {
	return &Verifier{Issuer: i.Issuer, Audience: i.Audience, Leeway: Leeway,
		keys: jose.JSONWebKeySet{Keys: []jose.JSONWebKey{i.pub}}}
}

// Mint returns a signed JWT for user sub, valid from now for ttl.
func (i *Issuer) Mint(sub string, ttl time.Duration) (string, error) {
	if sub == "" {
		return "", errors.New("devauth: mint: sub is required")
	}
	if ttl <= 0 {
		return "", fmt.Errorf("devauth: mint: ttl %v is not positive", ttl)
	}
	now := i.Now()
	tok, err := jwt.Signed(i.signer).Claims(jwt.Claims{
		Issuer: i.Issuer, Audience: jwt.Audience{i.Audience}, Subject: sub,
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(ttl)),
	}).Serialize()
	if err != nil {
		return "", fmt.Errorf("devauth: mint: %w", err)
	}
	return tok, nil
}

// Verifier checks tokens as API Gateway's JWT authorizer does. Set the
// fields before use only; Verify is safe for concurrent use.
type Verifier struct {
	Issuer   string           // the iss a token must carry
	Audience string           // an aud a token must carry (or its client_id, without aud)
	Leeway   time.Duration    // clock skew tolerated on exp, nbf and iat
	Now      func() time.Time // the clock; time.Now when nil

	// keys: each request's token is checked in full, as API Gateway's
	// authorizer does; nothing is kept of an earlier check.
	keys jose.JSONWebKeySet
}

// NewVerifier returns a Verifier of the keys of a JWKS document.
func NewVerifier(jwks []byte, issuer, audience string) (*Verifier, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(jwks, &set); err != nil {
		return nil, fmt.Errorf("devauth: jwks: %w", err)
	}
	if len(set.Keys) == 0 {
		return nil, errors.New("devauth: jwks has no key")
	}
	return &Verifier{Issuer: issuer, Audience: audience, Leeway: Leeway, keys: set}, nil
}

// LoadVerifier returns a Verifier of the JWKS in dir (written by Open),
// expecting IssuerURL and Audience.
func LoadVerifier(dir string) (*Verifier, error) {
	b, err := os.ReadFile(filepath.Join(dir, jwksFile))
	if err != nil {
		return nil, fmt.Errorf("devauth: %w", err)
	}
	return NewVerifier(b, IssuerURL, Audience)
}

// Verify checks a compact JWS token (without "Bearer ") and returns its
// claims, each a string as API Gateway passes them in
// requestContext.authorizer.jwt.claims: numbers in decimal, booleans as
// true/false, arrays as "[a b]", objects as JSON. Every error wraps
// ErrInvalidToken.
func (v *Verifier) Verify(token string) (map[string]string, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidToken}, args...)...)
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	raw, err := v.verifySignature(token)
	if err != nil {
		return nil, bad("%w", err)
	}
	var std jwt.Claims
	if err := json.Unmarshal(raw, &std); err != nil {
		return nil, bad("claims: %w", err)
	}
	if len(std.Audience) == 0 {
		// API Gateway checks client_id only when aud is absent (Cognito access tokens).
		var c struct {
			ClientID string `json:"client_id"`
		}
		if err := json.Unmarshal(raw, &c); err != nil || c.ClientID != v.Audience {
			return nil, bad("%w", jwt.ErrInvalidAudience)
		}
	} else if !std.Audience.Contains(v.Audience) {
		return nil, bad("%w", jwt.ErrInvalidAudience)
	}
	if std.Expiry == nil {
		return nil, bad("no exp")
	}
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: v.Issuer, Time: now()}, v.Leeway); err != nil {
		return nil, bad("%w", err)
	}
	claims, err := stringClaims(raw)
	if err != nil {
		return nil, bad("%w", err)
	}
	return claims, nil
}

// verifySignature checks a compact JWS: three base64url parts, a header
// naming RS256 and a kid of the JWKS (and nothing critical), and an RS256
// signature by that key (crypto/rsa's PKCS #1 v1.5 over SHA-256). It
// returns the payload. This is the one form a JWT authorizer takes, parsed
// here rather than by go-jose's general JWS code, which cost the dev
// gateway as much CPU per request as the RSA verification itself
// (docs/benchmarks.md).
func (v *Verifier) verifySignature(token string) ([]byte, error) {
	// base64url and dots only: Go's decoder skips line breaks, which would
	// let one signed token verify as endless strings (API Gateway refuses them).
	if strings.ContainsFunc(token, notCompactChar) {
		return nil, errors.New("not a compact JWS: a character outside base64url")
	}
	head, rest, ok1 := strings.Cut(token, ".")
	body, sig, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(sig, ".") {
		return nil, errors.New("not a compact JWS")
	}
	hb, err := base64.RawURLEncoding.Strict().DecodeString(head)
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	var h struct {
		Alg  string          `json:"alg"`
		Kid  string          `json:"kid"`
		Crit json.RawMessage `json:"crit"`
		B64  json.RawMessage `json:"b64"`
	}
	if err := json.Unmarshal(hb, &h); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	// Only RS256: "none", HS256 (keyed with the public key) and the rest fail here.
	if h.Alg != string(jose.RS256) {
		return nil, fmt.Errorf("alg %q, want RS256", h.Alg)
	}
	if h.Crit != nil || h.B64 != nil {
		return nil, errors.New("critical header parameters are not accepted")
	}
	keys := v.keys.Key(h.Kid)
	if h.Kid == "" || len(keys) == 0 {
		return nil, fmt.Errorf("no key %q in the JWKS", h.Kid)
	}
	pub, ok := keys[0].Key.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("key %q is not an RSA public key", h.Kid)
	}
	sb, err := base64.RawURLEncoding.Strict().DecodeString(sig)
	if err != nil {
		return nil, fmt.Errorf("signature: %w", err)
	}
	digest := sha256.Sum256([]byte(token[:len(head)+1+len(body)]))
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], sb); err != nil {
		return nil, fmt.Errorf("%w: %w", jose.ErrCryptoFailure, err)
	}
	payload, err := base64.RawURLEncoding.Strict().DecodeString(body)
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	return payload, nil
}

// notCompactChar is a character a compact JWS cannot have.
func notCompactChar(r rune) bool { return r >= 128 || !compact[r] }

// compact marks a compact JWS's characters: base64url and the dots.
var compact = func() (set [128]bool) {
	for _, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_." {
		set[c] = true
	}
	return set
}()

func stringClaims(raw []byte) (map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(m))
	for k, x := range m {
		out[k] = claimString(x)
	}
	return out, nil
}

func claimString(x any) string {
	switch x := x.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	case nil:
		return "null"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = claimString(e)
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	b, _ := json.Marshal(x)
	return string(b)
}
