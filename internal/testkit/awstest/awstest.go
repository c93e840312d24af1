// Package awstest keeps tests' AWS SDK clients on this machine and off the
// developer's account: static test credentials, no shared config or
// credentials file, no instance metadata (169.254.169.254).
//
// Every test package whose binary links the SDK's config loader runs Main
// from its TestMain (test/layout checks it), so the code under test, which
// calls the SDK's default chain as it does in Lambda, finds only the test
// values, whether or not `make test` exported any.
package awstest

import (
	"context"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
)

// The test credentials and region: the values scripts/services.sh exports,
// which goaws and moto accept.
const (
	AccessKeyID     = "local"
	SecretAccessKey = "local"
	Region          = "us-east-1"
)

// Set are the variables Isolate sets; Unset those it removes: every other
// way the default chain finds credentials, a profile or an endpoint.
var (
	Set = map[string]string{
		"AWS_ACCESS_KEY_ID":           AccessKeyID,
		"AWS_SECRET_ACCESS_KEY":       SecretAccessKey,
		"AWS_REGION":                  Region,
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_CONFIG_FILE":             os.DevNull, // an empty file
		"AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	}
	Unset = []string{
		"AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_DEFAULT_REGION",
		"AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME", "AWS_WEB_IDENTITY_TOKEN_FILE",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
		"AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
		"AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_SDK_LOAD_CONFIG",
	}
)

// Isolate sets the process environment so that the SDK's default chain
// finds only the test credentials. It leaves the per-service endpoints
// (AWS_ENDPOINT_URL_SQS, set by make test) alone: they point at loopback.
func Isolate() {
	for k, v := range Set {
		_ = os.Setenv(k, v) // cannot fail for these names
	}
	for _, k := range Unset {
		_ = os.Unsetenv(k)
	}
}

// Main is a whole TestMain: Isolate, then run the tests.
//
//	func TestMain(m *testing.M) { awstest.Main(m) }
func Main(m *testing.M) {
	Isolate()
	os.Exit(m.Run())
}

// Config is an SDK config for tests that build their own clients: the
// static test credentials and region, no shared files, no instance
// metadata, whatever the environment says. Endpoints still come from the
// environment (AWS_ENDPOINT_URL_SQS) or the client's options.
func Config(ctx context.Context) (aws.Config, error) {
	return awsconfig.LoadDefaultConfig(ctx,
		awsconfig.WithRegion(Region),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, "")),
		awsconfig.WithSharedConfigFiles([]string{}),
		awsconfig.WithSharedCredentialsFiles([]string{}),
		awsconfig.WithEC2IMDSClientEnableState(imds.ClientDisabled),
	)
}
