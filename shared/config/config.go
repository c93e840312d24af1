// Package config reads holdfast's settings from the environment, the one
// place every function, the dev stack and the template agree on. Secrets
// (the database password, the Redis AUTH token) come from Secrets Manager
// when a secret ARN is set, and from plain settings only locally.
package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
)

// Config is every setting of holdfast.
type Config struct {
	RedisAddr     string // host:port; with RedisCluster, a comma-separated list of seeds
	RedisCluster  bool
	RedisTLS      bool
	RedisPassword string // local only; in AWS use RedisSecretID
	// RedisSecretID names a Secrets Manager secret holding the AUTH token.
	RedisSecretID string

	DBDSN string // go-sql-driver DSN; in AWS built from DBHost/DBName and DBSecretID
	// DBSecretID names a Secrets Manager secret {"username","password"}:
	// the functions' own least-privilege user, which the migrate function
	// creates.
	DBSecretID string
	// DBAdminSecretID names the secret of the master user, which only the
	// migrate function reads; DBAdminDSN is its local stand-in.
	DBAdminSecretID, DBAdminDSN string
	// DBAppUser is the functions' MySQL account for this stage: the only one
	// the migrate function creates or changes (the secret gives its password).
	DBAppUser string
	DBHost    string // host:port of the RDS Proxy or cluster
	DBName    string
	DBMaxOpen int
	// DBTLS is "verify" (the certificate is checked) or, for local tests
	// only, "off".
	DBTLS string

	QueueURL       string // the reservation queue reserve sends to
	EventBusName   string // EventBridge bus for ReservationCancelled
	EventsQueueURL string // local stand-in for the bus (an SQS queue); used when EventBusName is empty
	// AWSEndpoint points every AWS client at a local server (the SQS-API
	// server). Local only; empty in AWS.
	AWSEndpoint string

	// IDSecretID names a Secrets Manager secret keying the ids derived from
	// an Idempotency-Key; IDSecretFile is a local file holding it (make dev).
	IDSecretID, IDSecretFile string
	// EdgeSecretID names the Secrets Manager secret the stack's CloudFront
	// distribution sends in httpapi.EdgeHeader; EdgeSecret is its value
	// (make dev's gateway). With neither, anyone may read the waiting
	// room's status from the API directly.
	EdgeSecretID, EdgeSecret string
	// UserClaim is the JWT claim (as API Gateway passes it) naming the buyer.
	UserClaim string
	// UserRate and UserBurst bound each user's reserve attempts per SKU
	// (per second, and the burst) where the SKU sets none; 0 turns it off.
	UserRate, UserBurst int
	HoldRetention       time.Duration // how long finished holds stay in Redis for replays and polls
	Protocol            reservation.Config
	LogLevel            string
	// Stage names the deployment (a dimension of every metric); empty locally.
	Stage string
	// SQSSend is how reserve sends its message: "direct" (one signed
	// request in SQS's JSON protocol, the default) or "sdk" (the SDK's
	// SendMessage, the same request at about 2.5 times the CPU).
	SQSSend string
}

// Load reads the configuration through getenv (os.Getenv in production)
// and checks what every reservation function needs.
func Load(getenv func(string) string) (Config, error) {
	c, err := parse(getenv)
	if err != nil {
		return Config{}, err
	}
	if c.RedisAddr == "" {
		return Config{}, errors.New("config: HOLDFAST_REDIS_ADDR is required")
	}
	if c.DBDSN == "" && (c.DBSecretID == "" || c.DBHost == "") {
		return Config{}, errors.New("config: set HOLDFAST_DB_DSN, or HOLDFAST_DB_HOST with HOLDFAST_DB_SECRET_ID")
	}
	return c, nil
}

// LoadMigrate reads the configuration of the migrate function, which needs
// only the database: the master user's credentials (HOLDFAST_DB_ADMIN_SECRET_ID
// with HOLDFAST_DB_HOST, or HOLDFAST_DB_ADMIN_DSN locally) and the functions'
// user to create (HOLDFAST_DB_SECRET_ID, or the user of HOLDFAST_DB_DSN).
func LoadMigrate(getenv func(string) string) (Config, error) {
	c, err := parse(getenv)
	if err != nil {
		return Config{}, err
	}
	if c.DBAdminDSN == "" && (c.DBAdminSecretID == "" || c.DBHost == "") {
		return Config{}, errors.New("config: set HOLDFAST_DB_HOST with HOLDFAST_DB_ADMIN_SECRET_ID (or HOLDFAST_DB_ADMIN_DSN locally)")
	}
	if c.DBSecretID == "" && c.DBDSN == "" {
		return Config{}, errors.New("config: set HOLDFAST_DB_SECRET_ID (or HOLDFAST_DB_DSN locally): the functions' user to create")
	}
	return c, nil
}

func parse(getenv func(string) string) (Config, error) {
	p := parser{getenv: getenv}
	c := Config{
		RedisAddr:       p.str("HOLDFAST_REDIS_ADDR", ""),
		RedisCluster:    p.boolean("HOLDFAST_REDIS_CLUSTER"),
		RedisTLS:        p.boolean("HOLDFAST_REDIS_TLS"),
		RedisPassword:   p.str("HOLDFAST_REDIS_PASSWORD", ""),
		RedisSecretID:   p.str("HOLDFAST_REDIS_SECRET_ID", ""),
		DBDSN:           p.str("HOLDFAST_DB_DSN", ""),
		DBSecretID:      p.str("HOLDFAST_DB_SECRET_ID", ""),
		DBAdminSecretID: p.str("HOLDFAST_DB_ADMIN_SECRET_ID", ""),
		DBAdminDSN:      p.str("HOLDFAST_DB_ADMIN_DSN", ""),
		DBAppUser:       p.str("HOLDFAST_DB_APP_USER", ""),
		DBHost:          p.str("HOLDFAST_DB_HOST", ""),
		DBName:          p.str("HOLDFAST_DB_NAME", "holdfast"),
		DBMaxOpen:       p.integer("HOLDFAST_DB_MAX_OPEN", 10),
		DBTLS:           p.str("HOLDFAST_DB_TLS", "verify"),
		QueueURL:        p.str("HOLDFAST_QUEUE_URL", ""),
		EventBusName:    p.str("HOLDFAST_EVENT_BUS", ""),
		EventsQueueURL:  p.str("HOLDFAST_EVENTS_QUEUE_URL", ""),
		AWSEndpoint:     p.str("HOLDFAST_AWS_ENDPOINT", ""),
		IDSecretID:      p.str("HOLDFAST_ID_SECRET_ID", ""),
		IDSecretFile:    p.str("HOLDFAST_ID_SECRET_FILE", ""),
		EdgeSecretID:    p.str("HOLDFAST_EDGE_SECRET_ID", ""),
		EdgeSecret:      p.str("HOLDFAST_EDGE_SECRET", ""),
		UserClaim:       p.str("HOLDFAST_USER_CLAIM", "sub"),
		UserRate:        p.integer("HOLDFAST_USER_RATE", 5),
		UserBurst:       p.integer("HOLDFAST_USER_BURST", 10),
		HoldRetention:   p.duration("HOLDFAST_HOLD_RETENTION", 24*time.Hour),
		LogLevel:        p.str("HOLDFAST_LOG_LEVEL", "info"),
		Stage:           p.str("HOLDFAST_STAGE", ""),
		SQSSend:         p.str("HOLDFAST_SQS_SEND", "direct"),
	}
	d := reservation.DefaultConfig()
	c.Protocol = reservation.Config{
		HoldTTL:         p.duration("HOLDFAST_HOLD_TTL", d.HoldTTL),
		MaxQty:          p.integer("HOLDFAST_MAX_QTY", d.MaxQty),
		GroupTTL:        p.duration("HOLDFAST_GROUP_TTL", d.GroupTTL),
		MaxGroupTTL:     p.duration("HOLDFAST_MAX_GROUP_TTL", d.MaxGroupTTL),
		PersistAttempts: p.integer("HOLDFAST_PERSIST_ATTEMPTS", d.PersistAttempts),
		SweepGrace:      p.duration("HOLDFAST_SWEEP_GRACE", d.SweepGrace),
		SweepBatch:      p.integer("HOLDFAST_SWEEP_BATCH", d.SweepBatch),
		SweepLive:       p.integer("HOLDFAST_SWEEP_LIVE", d.SweepLive),
		SweepCatalog:    p.integer("HOLDFAST_SWEEP_CATALOG", d.SweepCatalog),
		ReconcileAfter:  p.duration("HOLDFAST_RECONCILE_AFTER", d.ReconcileAfter),
		SoldOutTTL:      p.duration("HOLDFAST_SOLD_OUT_TTL", d.SoldOutTTL),
		MaxOpenGroups:   p.integer("HOLDFAST_MAX_OPEN_GROUPS", d.MaxOpenGroups),
		WarmLead:        p.duration("HOLDFAST_WARM_LEAD", d.WarmLead),
		QueueLead:       p.duration("HOLDFAST_QUEUE_LEAD", d.QueueLead),
		AdmitFor:        p.duration("HOLDFAST_ADMIT_FOR", d.AdmitFor),
	}
	if p.err != nil {
		return Config{}, p.err
	}
	if c.SQSSend != "direct" && c.SQSSend != "sdk" {
		return Config{}, fmt.Errorf("config: HOLDFAST_SQS_SEND=%q: want direct or sdk", c.SQSSend)
	}
	if c.DBTLS != "verify" && c.DBTLS != "off" {
		return Config{}, fmt.Errorf("config: HOLDFAST_DB_TLS=%q: want verify or off", c.DBTLS)
	}
	if c.Protocol.HoldTTL <= 0 || c.Protocol.MaxQty < 1 || c.Protocol.PersistAttempts < 1 {
		return Config{}, errors.New("config: HOLDFAST_HOLD_TTL, HOLDFAST_MAX_QTY and HOLDFAST_PERSIST_ATTEMPTS must be positive")
	}
	if c.Protocol.WarmLead < 0 {
		return Config{}, errors.New("config: HOLDFAST_WARM_LEAD must be 0 (never) or more")
	}
	if c.Protocol.QueueLead < 0 || c.Protocol.AdmitFor <= 0 {
		return Config{}, errors.New("config: HOLDFAST_QUEUE_LEAD must be 0 or more and HOLDFAST_ADMIT_FOR positive")
	}
	if c.Protocol.MaxOpenGroups < 0 {
		return Config{}, errors.New("config: HOLDFAST_MAX_OPEN_GROUPS must be 0 (no cap) or more")
	}
	if c.Protocol.SweepBatch < 1 || c.Protocol.SweepLive < 1 || c.Protocol.SweepCatalog < 1 {
		return Config{}, errors.New("config: HOLDFAST_SWEEP_BATCH, HOLDFAST_SWEEP_LIVE and HOLDFAST_SWEEP_CATALOG must be positive")
	}
	return c, nil
}

// Keys returns the name of every environment variable Load reads, so that
// tests can hold template.yaml and the code to the same list.
func Keys() []string {
	var keys []string
	_, _ = Load(func(k string) string {
		keys = append(keys, k)
		return ""
	})
	return keys
}

// NeedsQueue reports an error unless the reservation queue is configured.
func (c Config) NeedsQueue() error {
	if c.QueueURL == "" {
		return errors.New("config: HOLDFAST_QUEUE_URL is required")
	}
	return nil
}

// NeedsEvents reports an error unless an event destination is configured.
func (c Config) NeedsEvents() error {
	if c.EventBusName == "" && c.EventsQueueURL == "" {
		return errors.New("config: set HOLDFAST_EVENT_BUS (or HOLDFAST_EVENTS_QUEUE_URL locally)")
	}
	return nil
}

type parser struct {
	getenv func(string) string
	err    error
}

func (p *parser) str(key, def string) string {
	if v := strings.TrimSpace(p.getenv(key)); v != "" {
		return v
	}
	return def
}

func (p *parser) boolean(key string) bool {
	v := p.str(key, "false")
	b, err := strconv.ParseBool(v)
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("config: %s=%q is not a boolean", key, v)
	}
	return b
}

func (p *parser) integer(key string, def int) int {
	v := p.str(key, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("config: %s=%q is not an integer", key, v)
	}
	return n
}

func (p *parser) duration(key string, def time.Duration) time.Duration {
	v := p.str(key, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("config: %s=%q is not a duration (e.g. 90s, 5m)", key, v)
	}
	return d
}
