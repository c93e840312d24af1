package reservation

// Bucket naming: MaxBuckets, BucketName and ParseBucket (a bucket's name in
// Redis and back), HomeBucket (the bucket a request is held in), and a
// StockLevel's BucketCount and its share for one bucket (Bucket).

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// MaxBuckets bounds K.
const MaxBuckets = 64

// BucketName names bucket b of sku in Redis: the SKU itself for bucket 0,
// "<sku>#<b>" otherwise ('#' is never part of a SKU). Holds methods that take
// a SKU take a bucket's name.
func BucketName(sku string, b int) string {
	if b == 0 {
		return sku
	}
	return sku + "#" + strconv.Itoa(b)
}

// ParseBucket splits a bucket's name into its SKU and bucket number.
func ParseBucket(name string) (sku string, b int) {
	i := strings.LastIndexByte(name, '#')
	if i < 0 {
		return name, 0
	}
	b, err := strconv.Atoi(name[i+1:])
	if err != nil || b <= 0 || b >= MaxBuckets {
		return name, 0
	}
	return name[:i], b
}

// HomeBucket is the bucket a request is held in with k buckets: a group
// join's is bucket 0 (the group's slots are there); a buy's is a hash of its
// buyer.
func HomeBucket(user, group string, k int) int {
	if k <= 1 || group != "" {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(user))
	return int(h.Sum32() % uint32(k))
}

// BucketCount is K of a level (1 when unset).
func (l StockLevel) BucketCount() int { return max(1, l.Buckets) }

// Bucket returns bucket b's share of the level, named BucketName(sku, b):
// its available units (bucket 0 has what the others do not), the SKU's
// version (one order for every bucket's events), limits and, for bucket 0,
// the admin changes (they land there; transfers spread them).
func (l StockLevel) Bucket(b int) StockLevel {
	out := l
	out.SKU = BucketName(l.SKU, b)
	out.BucketAvailable = nil
	if b == 0 {
		for _, n := range l.BucketAvailable {
			out.Available -= n
		}
		return out
	}
	out.AdminDelta = 0
	out.Available = 0
	if b-1 < len(l.BucketAvailable) {
		out.Available = l.BucketAvailable[b-1]
	}
	return out
}
