package app

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awscreds "github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// The direct senders go where the SDK clients would: the regional endpoint
// in AWS (FIPS when configured), an override when one is set — for SQS not
// the queue URL's host, which a local SQS server may make up.
func TestDirectSendersGoWhereTheSDKGoes(t *testing.T) {
	creds := awscreds.NewStaticCredentialsProvider("AKID", "secret", "")
	fips := aws.FIPSEndpointStateEnabled
	sqsAt := func(o sqs.Options) func() (string, error) {
		o.Credentials = creds
		return func() (string, error) {
			p, err := directPublisher(context.Background(), sqs.New(o), "http://us-east-1.127.0.0.1:4100/000000000000/q")
			if err != nil {
				return "", err
			}
			return p.Endpoint(), nil
		}
	}
	eventsAt := func(o eventbridge.Options) func() (string, error) {
		o.Credentials = creds
		return func() (string, error) {
			c, err := eventbridgeDirect(context.Background(), eventbridge.New(o))
			return c.Endpoint, err
		}
	}
	for _, tc := range []struct {
		name     string
		endpoint func() (string, error)
		want     string
	}{
		{"sqs regional", sqsAt(sqs.Options{Region: "eu-west-1"}), "https://sqs.eu-west-1.amazonaws.com"},
		{"sqs fips", sqsAt(sqs.Options{Region: "us-east-1", EndpointOptions: sqs.EndpointResolverOptions{UseFIPSEndpoint: fips}}), "https://sqs-fips.us-east-1.amazonaws.com"},
		{"sqs override", sqsAt(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://127.0.0.1:4100")}), "http://127.0.0.1:4100"},
		{"events regional", eventsAt(eventbridge.Options{Region: "eu-west-1"}), "https://events.eu-west-1.amazonaws.com"},
		{"events fips", eventsAt(eventbridge.Options{Region: "us-east-1", EndpointOptions: eventbridge.EndpointResolverOptions{UseFIPSEndpoint: fips}}), "https://events-fips.us-east-1.amazonaws.com"},
		{"events override", eventsAt(eventbridge.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://127.0.0.1:5000")}), "http://127.0.0.1:5000"},
	} {
		got, err := tc.endpoint()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: endpoint %s, want %s", tc.name, got, tc.want)
		}
	}
}
