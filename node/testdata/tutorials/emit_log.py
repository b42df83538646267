#!/usr/bin/env python3
import os
import sys
import pika

connection = pika.BlockingConnection(
    pika.ConnectionParameters(host='localhost', port=int(os.environ.get('AMQP_PORT', 5672))))
channel = connection.channel()

channel.exchange_declare(exchange='logs', exchange_type='fanout')

message = ' '.join(sys.argv[1:]) or "info: Hello World!"
channel.basic_publish(exchange='logs', routing_key='', body=message)
print(f" [x] Sent {message}")
connection.close()
