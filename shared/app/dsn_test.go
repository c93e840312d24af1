package app

import (
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/holdfast/holdfast/shared/config"
)

// The database DSN in AWS requires verified TLS: never "preferred" (which
// checks no certificate and falls back to plaintext), never skip-verify.
func TestSecretDSNRequiresVerifiedTLS(t *testing.T) {
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HOLDFAST_REDIS_ADDR": "r:6379", "HOLDFAST_DB_HOST": "proxy:3306", "HOLDFAST_DB_SECRET_ID": "arn"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	mc, err := mysql.ParseDSN(secretDSN(cfg, "app", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	if mc.TLS == nil || mc.TLS.InsecureSkipVerify || mc.TLSConfig != "true" {
		t.Errorf("DSN TLS = %q (%+v), want verified TLS", mc.TLSConfig, mc.TLS)
	}
}
