#!/usr/bin/env python3
import os
import pika
import time

connection = pika.BlockingConnection(
    pika.ConnectionParameters(host='localhost', port=int(os.environ.get('AMQP_PORT', 5672))))
channel = connection.channel()

channel.queue_declare(queue='task_queue', durable=True)
print(' [*] Waiting for messages. To exit press CTRL+C', flush=True)


def callback(ch, method, properties, body):
    print(f" [x] Received {body.decode()}", flush=True)
    time.sleep(body.count(b'.'))
    print(" [x] Done", flush=True)
    ch.basic_ack(delivery_tag=method.delivery_tag)


channel.basic_qos(prefetch_count=1)
channel.basic_consume(queue='task_queue', on_message_callback=callback)

channel.start_consuming()
