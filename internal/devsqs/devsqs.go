// Package devsqs is the dev stack's SQS client for the event source: the
// ReceiveMessage and DeleteMessageBatch requests the SDK's client sends (SQS's
// JSON protocol, the same target, body and Signature Version 4), one signed
// request each, without the SDK's per-call middleware stack, which cost the
// dev stack more CPU than the requests themselves (docs/benchmarks.md). It
// stands in for Lambda's event source mapping, whose polling AWS does, so it
// is dev and test code only; the functions keep the SDK.
package devsqs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/shared/awsjson"
)

// Client sends an event source's receives and deletes.
type Client struct {
	json *awsjson.Client
}

// New returns a Client with the endpoint, region and credentials the SDK
// client resolved (an endpoint override such as AWS_ENDPOINT_URL_SQS
// included). A refused request's error is an *awsjson.Error; no request
// is tried twice (the event source polls again).
func New(ctx context.Context, c *sqs.Client) (*Client, error) {
	o := c.Options()
	ep, err := o.EndpointResolverV2.ResolveEndpoint(ctx, sqs.EndpointParameters{Region: aws.String(o.Region), Endpoint: o.BaseEndpoint})
	if err != nil {
		return nil, fmt.Errorf("devsqs: endpoint: %w", err)
	}
	if o.Credentials == nil {
		return nil, errors.New("devsqs: the SQS client has no credentials")
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64 // every poller keeps its connection
	jc, err := awsjson.NewClient(awsjson.SQS, awsjson.Config{Endpoint: ep.URI.String(), Region: o.Region, Credentials: o.Credentials,
		HTTPClient: &http.Client{Transport: t, Timeout: time.Minute}, Attempts: 1})
	if err != nil {
		return nil, fmt.Errorf("devsqs: %w", err)
	}
	return &Client{json: jc}, nil
}

// call sends one request of SQS's JSON protocol and decodes its answer into out.
func (c *Client) call(ctx context.Context, op string, in, out any) error {
	payload, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("sqs %s: %w", op, err)
	}
	return c.json.Call(ctx, op, payload, func(data []byte) error { return json.Unmarshal(data, out) })
}

type receiveInput struct {
	QueueURL                    string   `json:"QueueUrl"`
	MaxNumberOfMessages         int32    `json:"MaxNumberOfMessages,omitempty"`
	VisibilityTimeout           int32    `json:"VisibilityTimeout,omitempty"`
	WaitTimeSeconds             int32    `json:"WaitTimeSeconds,omitempty"`
	MessageAttributeNames       []string `json:"MessageAttributeNames,omitempty"`
	MessageSystemAttributeNames []string `json:"MessageSystemAttributeNames,omitempty"`
}

type attributeValue struct {
	DataType    string  `json:"DataType"`
	StringValue *string `json:"StringValue,omitempty"`
}

type message struct {
	MessageID         string                    `json:"MessageId"`
	ReceiptHandle     string                    `json:"ReceiptHandle"`
	MD5OfBody         string                    `json:"MD5OfBody"`
	Body              string                    `json:"Body"`
	Attributes        map[string]string         `json:"Attributes"`
	MessageAttributes map[string]attributeValue `json:"MessageAttributes"`
}

// ReceiveMessage implements eventsource.API.
func (c *Client) ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, _ ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	req := receiveInput{QueueURL: aws.ToString(in.QueueUrl), MaxNumberOfMessages: in.MaxNumberOfMessages,
		VisibilityTimeout: in.VisibilityTimeout, WaitTimeSeconds: in.WaitTimeSeconds, MessageAttributeNames: in.MessageAttributeNames}
	for _, n := range in.MessageSystemAttributeNames {
		req.MessageSystemAttributeNames = append(req.MessageSystemAttributeNames, string(n))
	}
	var out struct {
		Messages []message `json:"Messages"`
	}
	if err := c.call(ctx, "ReceiveMessage", req, &out); err != nil {
		return nil, err
	}
	res := &sqs.ReceiveMessageOutput{Messages: make([]sqstypes.Message, 0, len(out.Messages))}
	for _, m := range out.Messages {
		var attrs map[string]sqstypes.MessageAttributeValue
		if len(m.MessageAttributes) > 0 {
			attrs = make(map[string]sqstypes.MessageAttributeValue, len(m.MessageAttributes))
			for k, v := range m.MessageAttributes {
				attrs[k] = sqstypes.MessageAttributeValue{DataType: aws.String(v.DataType), StringValue: v.StringValue}
			}
		}
		res.Messages = append(res.Messages, sqstypes.Message{MessageId: aws.String(m.MessageID), ReceiptHandle: aws.String(m.ReceiptHandle),
			MD5OfBody: aws.String(m.MD5OfBody), Body: aws.String(m.Body), Attributes: m.Attributes, MessageAttributes: attrs})
	}
	return res, nil
}

type deleteEntry struct {
	ID            string `json:"Id"`
	ReceiptHandle string `json:"ReceiptHandle"`
}

type deleteInput struct {
	QueueURL string        `json:"QueueUrl"`
	Entries  []deleteEntry `json:"Entries"`
}

type batchFailure struct {
	ID          string `json:"Id"`
	Code        string `json:"Code"`
	Message     string `json:"Message"`
	SenderFault bool   `json:"SenderFault"`
}

// DeleteMessageBatch implements eventsource.API.
func (c *Client) DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	req := deleteInput{QueueURL: aws.ToString(in.QueueUrl), Entries: make([]deleteEntry, 0, len(in.Entries))}
	for _, e := range in.Entries {
		req.Entries = append(req.Entries, deleteEntry{ID: aws.ToString(e.Id), ReceiptHandle: aws.ToString(e.ReceiptHandle)})
	}
	var out struct {
		Failed []batchFailure `json:"Failed"`
	}
	if err := c.call(ctx, "DeleteMessageBatch", req, &out); err != nil {
		return nil, err
	}
	res := &sqs.DeleteMessageBatchOutput{}
	for _, f := range out.Failed {
		res.Failed = append(res.Failed, sqstypes.BatchResultErrorEntry{Id: aws.String(f.ID), Code: aws.String(f.Code),
			Message: aws.String(f.Message), SenderFault: f.SenderFault})
	}
	return res, nil
}
