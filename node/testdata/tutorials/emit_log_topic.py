#!/usr/bin/env python3
import os
import sys
import pika

connection = pika.BlockingConnection(
    pika.ConnectionParameters(host='localhost', port=int(os.environ.get('AMQP_PORT', 5672))))
channel = connection.channel()

channel.exchange_declare(exchange='topic_logs', exchange_type='topic')

routing_key = sys.argv[1] if len(sys.argv) > 2 else 'anonymous.info'
message = ' '.join(sys.argv[2:]) or 'Hello World!'
channel.basic_publish(
    exchange='topic_logs', routing_key=routing_key, body=message)
print(f" [x] Sent {routing_key}:{message}")
connection.close()
