package system_test

// Helpers of the bucket tests (buckets_test.go): users in a given home
// bucket, a bucket's figure, a MySQL row lock that makes a transfer wait
// (as it waits behind persist's batch on the stock row in a sale).

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/holdfast/holdfast/shared/reservation"
)

// userIn returns a user whose home bucket (of k) is b.
func userIn(prefix string, b, k int) string {
	for i := 0; ; i++ {
		u := fmt.Sprintf("%s-%d", prefix, i)
		if reservation.HomeBucket(u, "", k) == b {
			return u
		}
	}
}

// bucketAvail reads bucket b's Redis stock figure.
func (s *stack) bucketAvail(sku string, b int) int64 {
	s.t.Helper()
	n, err := s.rdb.Get(context.Background(), "hf:{"+reservation.BucketName(sku, b)+"}:stock").Int64()
	if err != nil {
		s.t.Fatalf("stock of bucket %d: %v", b, err)
	}
	return n
}

// lockRow holds a MySQL row lock (query … FOR UPDATE) until the test ends or
// release is called.
func (s *stack) lockRow(query string, args ...any) (release func()) {
	s.t.Helper()
	tx, err := s.db.Begin()
	if err != nil {
		s.t.Fatal(err)
	}
	var v sql.NullInt64
	if err := tx.QueryRow(query, args...).Scan(&v); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = tx.Rollback() })
	return func() { _ = tx.Rollback() }
}

func ptr[T any](v T) *T { return &v }
