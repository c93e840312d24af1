package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/shared/config"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadDefaultsAndOverrides(t *testing.T) {
	c, err := config.Load(env(map[string]string{
		"HOLDFAST_REDIS_ADDR": "127.0.0.1:6379", "HOLDFAST_DB_DSN": "u:p@tcp(127.0.0.1:3306)/h",
		"HOLDFAST_HOLD_TTL": "90s", "HOLDFAST_MAX_QTY": "3", "HOLDFAST_ADMIT_FOR": "1s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Protocol.AdmitFor != time.Second || c.Protocol.QueueLead != 15*time.Minute {
		t.Errorf("Load: AdmitFor %v, QueueLead %v; want 1s and the default 15m", c.Protocol.AdmitFor, c.Protocol.QueueLead)
	}
	if c.Protocol.HoldTTL != 90*time.Second || c.Protocol.MaxQty != 3 || c.Protocol.PersistAttempts != 8 || c.HoldRetention != 24*time.Hour {
		t.Errorf("Load = %+v", c)
	}
}

func TestLoadErrorsNameTheSetting(t *testing.T) {
	base := map[string]string{"HOLDFAST_REDIS_ADDR": "r:1", "HOLDFAST_DB_DSN": "d"}
	for key, val := range map[string]string{
		"HOLDFAST_HOLD_TTL":         "soon",
		"HOLDFAST_MAX_QTY":          "ten",
		"HOLDFAST_REDIS_TLS":        "maybe",
		"HOLDFAST_REDIS_ADDR":       "",
		"HOLDFAST_DB_DSN":           "",
		"HOLDFAST_PERSIST_ATTEMPTS": "0",
		"HOLDFAST_ADMIT_FOR":        "0s",
		"HOLDFAST_QUEUE_LEAD":       "-1m",
	} {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		m[key] = val
		if _, err := config.Load(env(m)); err == nil || !strings.Contains(err.Error(), strings.Split(key, "_ATTEMPTS")[0]) {
			t.Errorf("Load with %s=%q = %v, want an error naming it", key, val, err)
		}
	}
}
