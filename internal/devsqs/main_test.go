package devsqs_test

import (
	"testing"

	"github.com/holdfast/holdfast/internal/testkit/awstest"
)

// TestMain keeps the SDK's default chain on test credentials: no test reads
// the developer's AWS config or reaches the instance metadata address.
func TestMain(m *testing.M) { awstest.Main(m) }
