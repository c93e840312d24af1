package devauth_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/holdfast/holdfast/internal/devauth"
)

func open(t *testing.T, dir string) *devauth.Issuer {
	t.Helper()
	iss, err := devauth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// privateKey is the key Open wrote to dir.
func privateKey(t *testing.T, dir string) any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "private.pem"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// signWith signs any claims with the key Open wrote to dir, as another
// issuer (or an attacker holding the key) could.
func signWith(t *testing.T, dir, kid string, claims any) string {
	t.Helper()
	key := privateKey(t, dir)
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: kid}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// signRaw is a compact RS256 JWS of header (JSON, as given) and claims,
// signed with dir's key by crypto/rsa directly: for headers go-jose's
// signer would not write.
func signRaw(t *testing.T, dir, header string, claims any) string {
	t.Helper()
	key := privateKey(t, dir)
	body, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	input := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString(body)
	digest := sha256.Sum256([]byte(input))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key.(*rsa.PrivateKey), crypto.SHA256, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return input + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func segment(t *testing.T, tok string, i int) map[string]any {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[i])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMintThenVerify(t *testing.T) {
	iss := open(t, t.TempDir())
	before := time.Now().Unix()
	tok, err := iss.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h := segment(t, tok, 0)
	if h["alg"] != "RS256" || h["kid"] != iss.KeyID() || h["typ"] != "JWT" || iss.KeyID() == "" {
		t.Errorf("header = %v, want alg RS256, typ JWT, kid %q", h, iss.KeyID())
	}
	claims, err := iss.Verifier().Verify(tok)
	if err != nil {
		t.Fatalf("Verify(minted) = %v", err)
	}
	want := map[string]string{"sub": "ann", "iss": devauth.IssuerURL, "aud": devauth.Audience}
	for k, v := range want {
		if claims[k] != v {
			t.Errorf("claims[%q] = %q, want %q", k, claims[k], v)
		}
	}
	for _, k := range []string{"iat", "nbf", "exp"} {
		if claims[k] == "" {
			t.Errorf("claims[%q] missing", k)
		}
	}
	var exp, iat int64
	if err := json.Unmarshal([]byte(claims["exp"]), &exp); err != nil {
		t.Fatalf("exp = %q: %v", claims["exp"], err)
	}
	if err := json.Unmarshal([]byte(claims["iat"]), &iat); err != nil {
		t.Fatalf("iat = %q: %v", claims["iat"], err)
	}
	if iat < before || exp-iat != 3600 {
		t.Errorf("iat %d exp %d, want iat ≥ %d and exp = iat + 3600", iat, exp, before)
	}
	if _, err := iss.Mint("", time.Hour); err == nil {
		t.Error("Mint with an empty sub succeeded")
	}
	if _, err := iss.Mint("ann", 0); err == nil {
		t.Error("Mint with ttl 0 succeeded")
	}
}

func TestOpenKeepsOneKeyOnDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "jwt")
	first := open(t, dir)
	for name, want := range map[string]os.FileMode{"private.pem": 0o600, "jwks.json": 0o644, ".": 0o700 | os.ModeDir} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != want {
			t.Errorf("%s mode = %v, want %v", name, st.Mode(), want)
		}
	}
	jwks, err := os.ReadFile(filepath.Join(dir, "jwks.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(jwks), `"d"`) || !strings.Contains(string(jwks), first.KeyID()) {
		t.Errorf("jwks.json = %s, want the public key only, with kid %s", jwks, first.KeyID())
	}
	tok, err := first.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	second := open(t, dir)
	if second.KeyID() != first.KeyID() {
		t.Errorf("reopened kid = %s, want %s", second.KeyID(), first.KeyID())
	}
	loaded, err := devauth.LoadVerifier(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]*devauth.Verifier{"reopened": second.Verifier(), "loaded": loaded} {
		if _, err := v.Verify(tok); err != nil {
			t.Errorf("%s verifier: Verify = %v", name, err)
		}
	}
}

func TestOpenConcurrentlyAgreesOnTheKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "jwt")
	kids := make([]string, 6)
	var wg sync.WaitGroup
	for i := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			iss, err := devauth.Open(dir)
			if err != nil {
				t.Error(err)
				return
			}
			kids[i] = iss.KeyID()
		}()
	}
	wg.Wait()
	for _, k := range kids {
		if k != kids[0] {
			t.Fatalf("kids = %v, want one key", kids)
		}
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestVerifyRejects(t *testing.T) {
	dir := t.TempDir()
	iss := open(t, dir)
	v := iss.Verifier()
	mint := func(change func(*devauth.Issuer)) string {
		c := *iss
		change(&c)
		tok, err := c.Mint("ann", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	good := mint(func(*devauth.Issuer) {})
	parts := strings.Split(good, ".")
	flip := func(s string) string { // change one signature byte, keep it base64url
		b, _ := base64.RawURLEncoding.DecodeString(s)
		b[len(b)/2] ^= 0x01
		return base64.RawURLEncoding.EncodeToString(b)
	}
	payload := func(m map[string]any) string {
		b, _ := json.Marshal(m)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	now := time.Now()
	claims := func(extra map[string]any) map[string]any {
		m := map[string]any{"iss": devauth.IssuerURL, "aud": devauth.Audience, "sub": "ann",
			"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix()}
		for k, x := range extra {
			if x == nil {
				delete(m, k)
			} else {
				m[k] = x
			}
		}
		return m
	}
	hs256 := func() string { // alg confusion: HMAC keyed with the public JWKS
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: jose.JSONWebKey{Key: iss.JWKS(), KeyID: iss.KeyID()}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(s).Claims(claims(nil)).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	other := open(t, t.TempDir())
	otherTok, err := other.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	noneHeader := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT","kid":"` + iss.KeyID() + `"}`))

	cases := []struct {
		name  string
		token string
		cause error // the go-jose cause, when there is one to name
	}{
		{"empty", "", nil},
		{"garbage", "not-a-jwt", nil},
		{"tampered signature", parts[0] + "." + parts[1] + "." + flip(parts[2]), jose.ErrCryptoFailure},
		{"tampered payload", parts[0] + "." + payload(claims(map[string]any{"sub": "bob"})) + "." + parts[2], jose.ErrCryptoFailure},
		{"signature stripped", parts[0] + "." + parts[1] + ".", nil},
		{"alg none", noneHeader + "." + parts[1] + ".", nil},
		{"alg HS256 keyed with the public key", hs256(), nil},
		{"wrong audience", mint(func(c *devauth.Issuer) { c.Audience = "someone-else" }), jwt.ErrInvalidAudience},
		{"wrong issuer", mint(func(c *devauth.Issuer) { c.Issuer = "https://evil.example/" }), jwt.ErrInvalidIssuer},
		{"expired", mint(func(c *devauth.Issuer) { c.Now = func() time.Time { return now.Add(-2 * time.Hour) } }), jwt.ErrExpired},
		{"not yet valid", signWith(t, dir, iss.KeyID(), claims(map[string]any{"nbf": now.Add(10 * time.Minute).Unix()})), jwt.ErrNotValidYet},
		{"issued in the future", signWith(t, dir, iss.KeyID(), claims(map[string]any{"iat": now.Add(10 * time.Minute).Unix()})), jwt.ErrIssuedInTheFuture},
		{"no exp", signWith(t, dir, iss.KeyID(), claims(map[string]any{"exp": nil})), nil},
		{"no aud nor client_id", signWith(t, dir, iss.KeyID(), claims(map[string]any{"aud": nil})), jwt.ErrInvalidAudience},
		{"unknown kid (another key)", otherTok, nil},
		{"unknown kid (right key, other kid)", signWith(t, dir, "other-kid", claims(nil)), nil},
		{"no kid", signWith(t, dir, "", claims(nil)), nil},
		{"a critical header parameter", signRaw(t, dir, `{"alg":"RS256","kid":"`+iss.KeyID()+`","crit":["exp"],"exp":1}`, claims(nil)), nil},
		{"an unencoded payload (b64 false)", signRaw(t, dir, `{"alg":"RS256","kid":"`+iss.KeyID()+`","b64":false,"crit":["b64"]}`, claims(nil)), nil},
		{"a header that is not an object", signRaw(t, dir, `["RS256"]`, claims(nil)), nil},
		{"claims that are not an object", signRaw(t, dir, `{"alg":"RS256","kid":"`+iss.KeyID()+`"}`, []string{"ann"}), nil},
		{"a fourth part", good + ".e30", nil},
		{"the JSON serialization", `{"payload":"` + parts[1] + `","protected":"` + parts[0] + `","signature":"` + parts[2] + `"}`, nil},
		{"padded base64", parts[0] + "=." + parts[1] + "." + parts[2], nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := v.Verify(c.token)
			if !errors.Is(err, devauth.ErrInvalidToken) {
				t.Fatalf("Verify(%s) = %v, %v; want ErrInvalidToken", c.name, got, err)
			}
			if c.cause != nil && !errors.Is(err, c.cause) {
				t.Errorf("Verify(%s) = %v, want it caused by %v", c.name, err, c.cause)
			}
		})
	}
	if _, err := v.Verify(good); err != nil {
		t.Errorf("Verify(good) = %v after the cases", err)
	}
	// signRaw's own token verifies: the cases above fail for what they name.
	if _, err := v.Verify(signRaw(t, dir, `{"alg":"RS256","kid":"`+iss.KeyID()+`","typ":"JWT"}`, claims(nil))); err != nil {
		t.Errorf("Verify(a hand-signed token) = %v", err)
	}
}

func TestVerifyToleratesSmallSkewAndTakesClientID(t *testing.T) {
	dir := t.TempDir()
	iss := open(t, dir)
	v := iss.Verifier()
	now := time.Now()
	accept := map[string]map[string]any{
		"expired 30s ago (leeway)": {"iss": devauth.IssuerURL, "aud": devauth.Audience, "sub": "ann",
			"iat": now.Add(-time.Hour).Unix(), "exp": now.Add(-30 * time.Second).Unix()},
		"nbf in 30s (leeway)": {"iss": devauth.IssuerURL, "aud": devauth.Audience, "sub": "ann",
			"nbf": now.Add(30 * time.Second).Unix(), "exp": now.Add(time.Hour).Unix()},
		"client_id without aud": {"iss": devauth.IssuerURL, "client_id": devauth.Audience, "sub": "ann",
			"exp": now.Add(time.Hour).Unix()},
		"aud list": {"iss": devauth.IssuerURL, "aud": []string{"x", devauth.Audience}, "sub": "ann",
			"exp": now.Add(time.Hour).Unix()},
	}
	for name, c := range accept {
		if _, err := v.Verify(signWith(t, dir, iss.KeyID(), c)); err != nil {
			t.Errorf("Verify(%s) = %v, want accepted", name, err)
		}
	}
}

func TestClaimsAreStringsAsAPIGatewayPassesThem(t *testing.T) {
	dir := t.TempDir()
	iss := open(t, dir)
	tok := signWith(t, dir, iss.KeyID(), map[string]any{
		"iss": devauth.IssuerURL, "aud": []string{devauth.Audience, "other"}, "sub": "ann", "exp": 4102444800,
		"cognito:groups": []string{"buyers", "vip"}, "email_verified": true, "scope": "a b",
	})
	got, err := iss.Verifier().Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"iss": devauth.IssuerURL, "aud": "[holdfast-dev other]", "sub": "ann", "exp": "4102444800",
		"cognito:groups": "[buyers vip]", "email_verified": "true", "scope": "a b",
	}
	if len(got) != len(want) {
		t.Errorf("claims = %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("claims[%q] = %q, want %q", k, got[k], w)
		}
	}
}

// A token verified once is remembered, but its times are checked on every use.
func TestVerifiedTokenStillExpires(t *testing.T) {
	iss := open(t, t.TempDir())
	v := iss.Verifier()
	now := time.Now()
	v.Now = func() time.Time { return now }
	tok, err := iss.Mint("ann", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		claims, err := v.Verify(tok)
		if err != nil || claims["sub"] != "ann" {
			t.Fatalf("Verify = %v, %v; want sub ann", claims, err)
		}
		claims["sub"] = "mallory" // the caller's copy
	}
	v.Now = func() time.Time { return now.Add(time.Hour + devauth.Leeway + time.Second) }
	if _, err := v.Verify(tok); !errors.Is(err, jwt.ErrExpired) {
		t.Errorf("Verify(expired since) = %v, want jwt.ErrExpired", err)
	}
}
