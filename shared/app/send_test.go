package app

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awscreds "github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// Reserve's direct sender goes where the SDK client would: the regional
// endpoint in AWS (FIPS when configured), an override when one is set — not
// the queue URL's host, which a local SQS server may make up.
func TestDirectPublisherGoesWhereTheSDKGoes(t *testing.T) {
	creds := awscreds.NewStaticCredentialsProvider("AKID", "secret", "")
	for _, tc := range []struct {
		name string
		opts sqs.Options
		want string
	}{
		{"regional", sqs.Options{Region: "eu-west-1"}, "https://sqs.eu-west-1.amazonaws.com"},
		{"fips", sqs.Options{Region: "us-east-1", EndpointOptions: sqs.EndpointResolverOptions{UseFIPSEndpoint: aws.FIPSEndpointStateEnabled}}, "https://sqs-fips.us-east-1.amazonaws.com"},
		{"override", sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://127.0.0.1:4100")}, "http://127.0.0.1:4100"},
	} {
		tc.opts.Credentials = creds
		p, err := directPublisher(context.Background(), sqs.New(tc.opts), "http://us-east-1.127.0.0.1:4100/000000000000/q")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if p.Endpoint() != tc.want {
			t.Errorf("%s: endpoint %s, want %s", tc.name, p.Endpoint(), tc.want)
		}
	}
}
