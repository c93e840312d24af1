package devsqs_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/holdfast/holdfast/internal/devsqs"
	"github.com/holdfast/holdfast/internal/testkit/testservices"
	"github.com/holdfast/holdfast/shared/awsjson"
)

// On the real SQS-API server, a message the SDK sent comes back through
// devsqs as the SDK's receive gives it (body, checksum, message and system
// attributes), and a batch delete removes exactly the entries whose receipt
// handles are good, reporting the others as failed.
func TestReceiveAndDeleteAsTheSDK(t *testing.T) {
	env := testservices.Require(t)
	ctx := context.Background()
	client := env.SQS(t)
	q := env.CreateQueues(t, client, 5)
	lean, err := devsqs.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	sent, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(q.URL), MessageBody: aws.String(`{"id":"r-1","note":"é \"q\""}`),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			"type":    {DataType: aws.String("String"), StringValue: aws.String("reservation")},
			"version": {DataType: aws.String("Number"), StringValue: aws.String("3")},
		}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := lean.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q.URL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
		VisibilityTimeout: 30, MessageAttributeNames: []string{"All"},
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 {
		t.Fatalf("received %d messages, want the one sent", len(out.Messages))
	}
	m := out.Messages[0]
	if aws.ToString(m.MessageId) != aws.ToString(sent.MessageId) || aws.ToString(m.Body) != `{"id":"r-1","note":"é \"q\""}` ||
		aws.ToString(m.MD5OfBody) != aws.ToString(sent.MD5OfMessageBody) || aws.ToString(m.ReceiptHandle) == "" {
		t.Errorf("received id %q body %q md5 %q handle %q, want id %q, the body sent, md5 %q and a handle",
			aws.ToString(m.MessageId), aws.ToString(m.Body), aws.ToString(m.MD5OfBody), aws.ToString(m.ReceiptHandle),
			aws.ToString(sent.MessageId), aws.ToString(sent.MD5OfMessageBody))
	}
	if a := m.MessageAttributes["type"]; aws.ToString(a.DataType) != "String" || aws.ToString(a.StringValue) != "reservation" {
		t.Errorf("attribute type = %s/%s, want String/reservation", aws.ToString(a.DataType), aws.ToString(a.StringValue))
	}
	if a := m.MessageAttributes["version"]; aws.ToString(a.DataType) != "Number" || aws.ToString(a.StringValue) != "3" {
		t.Errorf("attribute version = %s/%s, want Number/3", aws.ToString(a.DataType), aws.ToString(a.StringValue))
	}
	if m.Attributes["SentTimestamp"] == "" {
		t.Errorf("system attributes %v, want SentTimestamp among them", m.Attributes)
	}

	del, err := lean.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q.URL), Entries: []sqstypes.DeleteMessageBatchRequestEntry{
		{Id: aws.String("0"), ReceiptHandle: m.ReceiptHandle},
		{Id: aws.String("1"), ReceiptHandle: aws.String("not-a-receipt-handle")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(del.Failed) != 1 || aws.ToString(del.Failed[0].Id) != "1" || aws.ToString(del.Failed[0].Code) == "" {
		t.Errorf("delete failed entries %+v, want only entry 1, with its code", del.Failed)
	}
	attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q.URL),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages}})
	if err != nil {
		t.Fatal(err)
	}
	if n := attrs.Attributes["ApproximateNumberOfMessages"]; n != "0" {
		t.Errorf("%s messages left (visible or in flight), want 0: the delete removed the one", n)
	}
}

// A refused request is an *awsjson.Error with SQS's status and error code, and the
// error says which operation it was.
func TestRefusalIsAnError(t *testing.T) {
	env := testservices.Require(t)
	ctx := context.Background()
	client := env.SQS(t)
	q := env.CreateQueues(t, client, 5)
	lean, err := devsqs.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lean.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q.URL + "-missing"), MaxNumberOfMessages: 1})
	var e *awsjson.Error
	if !errors.As(err, &e) || e.Op != "ReceiveMessage" || e.Status/100 != 4 || e.Code == "" {
		t.Fatalf("receive from a missing queue: %v (%#v), want a 4xx *awsjson.Error with a code", err, e)
	}
}
